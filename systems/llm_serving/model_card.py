"""The served models' limits, stated here so parameters are checked without importing torch; unit
tests check them against the packages' files: all-MiniLM-L6-v2 run causally (``causal_minilm``, a
second model with the serving interface, used by the engine's logic tests) and SmolLM2-135M-Instruct
(``smollm2``, what radix and metropolis serve)."""
MODEL_NAME = "all-MiniLM-L6-v2"
MODEL_POSITIONS = 512      # max_position_embeddings: a request chain's prompt + output must fit
MODEL_VOCAB = 30522
FIRST_WORD_ID = 999        # ids below are [PAD], [unusedN], [UNK], [CLS], [SEP], [MASK]
TOKEN_IDS = range(FIRST_WORD_ID, MODEL_VOCAB)   # the ordinary wordpieces prompts are drawn from

SMOLLM2_NAME = "SmolLM2-135M-Instruct"
SMOLLM2_POSITIONS = 8192   # llama.context_length of the GGUF file
SMOLLM2_VOCAB = 49152
SMOLLM2_FIRST_ID = 17      # ids below are control tokens (<|endoftext|>, <|im_start|>, <|im_end|>, ...)
SMOLLM2_TOKEN_IDS = range(SMOLLM2_FIRST_ID, SMOLLM2_VOCAB)   # the ordinary BPE tokens prompts are drawn from
