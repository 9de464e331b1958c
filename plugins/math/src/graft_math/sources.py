"""The ``data_source`` values the math reward scores under ``algorithm.reward=auto``.

The math datasets verl's ``default_compute_score`` routes to its math scorers (GSM8K, MATH and
the Numina / DAPO sets), by the exact names its preprocessing scripts write. Prefixes (verl's
``aime*``) are not matched: set ``algorithm.reward=math`` for other names.
"""

DATA_SOURCES: tuple[str, ...] = (
    "openai/gsm8k",
    "lighteval/MATH",
    "DigitalLearningGmbH/MATH-lighteval",
    "HuggingFaceH4/MATH-500",
    "math_dapo",
    "numina_aops_forum",
    "numina_synthetic_math",
    "numina_amc_aime",
    "numina_synthetic_amc",
    "numina_cn_k12",
    "numina_olympiads",
)
