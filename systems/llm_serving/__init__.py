"""Shared by the LLM-serving family (``radix``, ``metropolis``): all-MiniLM-L6-v2 run as a causal
decoder with a slot-indexed KV pool (``causal_minilm``), the small pretrained model both serve, and its
limits (``model_card``, no torch import).

Members import the submodule (``from mlsys_flows.systems.llm_serving.causal_minilm import ...``): the
import contract allows ``systems.<member> -> systems.llm_serving.**``, which does not match the
package itself."""
