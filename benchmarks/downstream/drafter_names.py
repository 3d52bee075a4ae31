"""The names ``downstream eval --drafter`` and ``compare``'s ``FOLDER:DRAFTER`` take (no torch: the CLI reads them)."""

#: training-free drafting of a ``lora`` folder (arm e), and the hybrids of a trained drafter with SuffixDecoding
TRAINING_FREE = (
    "prompt-lookup",
    "token-recycling",
    "hybrid",
    "suffix",
    "hybrid-suffix",
    "hybrid-suffix-ungated",
    "hf-prompt-lookup",
    "engine",
)
#: the drafters warmed with the task's training targets (never its test set)
SUFFIX_DRAFTERS = ("suffix", "hybrid-suffix", "hybrid-suffix-ungated")
