"""LongBench metrics against values worked out by hand (see each comment for the arithmetic)."""

import pytest

from pytest_kvbench.tasks import metrics


class TestQaF1:
    def test_punctuation_case_and_articles_are_ignored(self):
        assert metrics.qa_f1("The Eiffel Tower!", "eiffel tower") == 1.0

    def test_partial_overlap(self):
        # "a big red apple" -> [big, red, apple]; "the red apple pie" -> [red, apple, pie]
        # common 2: precision 2/3, recall 2/3 -> F1 2/3
        assert metrics.qa_f1("a big red apple", "the red apple pie") == pytest.approx(2 / 3)

    def test_articles_only_removed_as_whole_words(self):
        assert metrics.qa_f1("Anna", "anna") == 1.0
        # "an" and "the" vanish entirely: nothing left to match
        assert metrics.qa_f1("an the", "the") == 0.0

    def test_repeated_tokens_count_once_per_occurrence(self):
        # [yes, yes] vs [yes]: common 1, precision 1/2, recall 1 -> 2/3
        assert metrics.qa_f1("yes yes", "yes") == pytest.approx(2 / 3)

    def test_empty_prediction_scores_zero(self):
        assert metrics.qa_f1("", "Paris") == 0.0
        assert metrics.qa_f1("!!!", "Paris") == 0.0

    def test_best_over_several_references(self):
        # vs "London": 0. vs "Paris": [paris, france] vs [paris] -> P 1/2, R 1 -> F1 2/3
        score = metrics.best_over_references(metrics.qa_f1, "Paris, France", ["London", "Paris"])
        assert score == pytest.approx(2 / 3)

    def test_no_references_scores_zero(self):
        assert metrics.best_over_references(metrics.qa_f1, "Paris", []) == 0.0


class TestQaF1Chinese:
    def test_jieba_words(self):
        # jieba: 我爱北京天安门 -> 我/爱/北京/天安门 ; 北京天安门 -> 北京/天安门
        # common 2: precision 2/4, recall 2/2 -> F1 2/3
        assert metrics.qa_f1_zh("我爱北京天安门", "北京天安门") == pytest.approx(2 / 3)

    def test_chinese_punctuation_dropped(self):
        assert metrics.qa_f1_zh("北京。", "北京") == 1.0
        assert metrics.qa_f1_zh("“北京”！", "北京") == 1.0

    def test_empty_prediction(self):
        assert metrics.qa_f1_zh("", "北京") == 0.0


class TestRougeL:
    def test_no_repeated_words(self):
        # LCS(a b c d, a c d e) = a c d = 3 of 4 words each side: R = P = 3/4 -> F = 3/4
        assert metrics.rouge_l("a b c d", "a c d e") == pytest.approx(0.75, abs=1e-6)

    def test_different_lengths(self):
        # hyp [police killed the gunman] (4), ref [the gunman was shot by police] (6); LCS "the gunman" = 2
        # R = 2/6, P = 2/4 ; F = 2 R P / (R + P) = (1/3) / (5/6) = 0.4
        assert metrics.rouge_l("police killed the gunman", "the gunman was shot by police") == pytest.approx(
            0.4, abs=1e-6
        )

    def test_package_counts_distinct_words(self):
        # the official `rouge` package counts distinct words and distinct LCS words:
        # hyp {the cat sat on mat} = 5, ref {the cat is on mat} = 5, LCS words {the cat on mat} = 4 -> 0.8
        assert metrics.rouge_l("the cat sat on the mat", "the cat is on the mat") == pytest.approx(0.8, abs=1e-6)

    def test_empty_or_degenerate_prediction_scores_zero(self):
        assert metrics.rouge_l("", "a summary") == 0.0
        assert metrics.rouge_l("...", "a summary") == 0.0
        assert metrics.rouge_l("   ", "a summary") == 0.0

    def test_chinese_through_jieba(self):
        # "我 爱 北京 天安门" vs "北京 天安门": LCS 2, R = 2/2, P = 2/4 -> F = 2 * 0.5 / 1.5 = 2/3
        assert metrics.rouge_l_zh("我爱北京天安门", "北京天安门") == pytest.approx(2 / 3, abs=1e-6)


class TestClassification:
    CLASSES = ("Animal", "Color", "City", "Country")

    def test_exact_class(self):
        assert metrics.classification("Color", "Color", all_classes=self.CLASSES) == 1.0

    def test_two_classes_named_share_the_credit(self):
        assert metrics.classification("Color or City", "City", all_classes=self.CLASSES) == 0.5

    def test_wrong_or_no_class(self):
        assert metrics.classification("Animal", "City", all_classes=self.CLASSES) == 0.0
        assert metrics.classification("no idea", "City", all_classes=self.CLASSES) == 0.0
        assert metrics.classification("", "City", all_classes=self.CLASSES) == 0.0

    def test_class_inside_the_reference_is_not_a_rival(self):
        classes = ["Other", "Other location"]
        assert metrics.classification("Other location", "Other location", all_classes=classes) == 1.0

    def test_official_skip_after_a_dropped_match(self):
        # matches: [Other, location, Other location]. "Other" is inside the reference and dropped;
        # the official loop then skips "location" (kept), so two matches remain -> 1/2.
        classes = ["Other", "location", "Other location"]
        assert metrics.classification("Other location", "Other location", all_classes=classes) == 0.5


class TestRetrievalAndCount:
    def test_retrieval(self):
        assert metrics.retrieval("Paragraph 3", "Paragraph 3") == 1.0
        assert metrics.retrieval("Paragraph 3 or Paragraph 12", "Paragraph 3") == 0.5
        assert metrics.retrieval("Paragraph 30", "Paragraph 3") == 0.0
        assert metrics.retrieval("", "Paragraph 3") == 0.0

    def test_retrieval_reference_without_number(self):
        assert metrics.retrieval("Paragraph 3", "no paragraph") == 0.0

    def test_retrieval_chinese(self):
        assert metrics.retrieval_zh("答案是段落5", "段落5") == 1.0
        assert metrics.retrieval_zh("段落5，段落6", "段落5") == 0.5

    def test_count(self):
        assert metrics.count("7", "7") == 1.0
        assert metrics.count("There are 7 unique paragraphs out of 10", "7") == 0.5
        assert metrics.count("seven", "7") == 0.0


class TestCodeSimilarity:
    def test_first_line_without_comment_or_fence(self):
        prediction = "```python\n# add one\n// not python\nreturn total + 1\nprint(total)"
        assert metrics.first_code_line(prediction) == "return total + 1"
        assert metrics.code_sim(prediction, "return total + 1") == 1.0

    def test_leading_newlines_skipped(self):
        assert metrics.first_code_line("\n\nx = 1\ny = 2") == "x = 1"

    def test_ratio_is_integer_percent(self):
        # "abcd" vs "abce": indel distance 2 over 8 characters -> 75
        assert metrics.code_sim("abcd", "abce") == 0.75
        # "abc" vs "abcd": 2 * 3 / 7 = 85.71 -> 86
        assert metrics.code_sim("abc", "abcd") == 0.86

    def test_empty_or_comment_only_prediction(self):
        assert metrics.code_sim("", "x = 1") == 0.0
        assert metrics.code_sim("# only a comment\n```", "x = 1") == 0.0


def test_first_line_rule():
    assert metrics.first_line("\n\nColor\nQuestion: next") == "Color"
    assert metrics.first_line("") == ""
