"""Long-generation reasoning: MATH-500 and AIME 2024/2025, scored with math-verify (optional extra)."""
