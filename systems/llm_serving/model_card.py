"""The served model's limits (all-MiniLM-L6-v2, run causally; ``causal_minilm`` loads it), stated here
so parameters are checked without importing torch; a unit test checks them against the package's
config and vocabulary."""
MODEL_NAME = "all-MiniLM-L6-v2"
MODEL_POSITIONS = 512      # max_position_embeddings: a request chain's prompt + output must fit
MODEL_VOCAB = 30522
FIRST_WORD_ID = 999        # ids below are [PAD], [unusedN], [UNK], [CLS], [SEP], [MASK]
TOKEN_IDS = range(FIRST_WORD_ID, MODEL_VOCAB)   # the ordinary wordpieces prompts are drawn from
