"""The parameters of a system whose language model is pluggable: the offline default unless
``llm_base_url`` names an OpenAI-compatible endpoint. One declaration, mixed into each such system's
``Params`` (``class Params(LLMEndpointParams, SystemParams)``); the task layer turns them into a client
with ``tasks.common.llm_client(p.llm_base_url, p.llm_model, p.api_key_secret, p.llm_timeout_s)``.
Pure: pydantic only.
"""
from __future__ import annotations

from pydantic import BaseModel, Field


class LLMEndpointParams(BaseModel):
    """Where the model lives when it is not the offline default."""

    llm_base_url: str | None = Field(
        None, min_length=8, max_length=500, pattern=r"^https?://",
        description="OpenAI-compatible endpoint (e.g. http://127.0.0.1:8000/v1) whose chat model replaces the "
                    "offline default; None: the offline default, nothing leaves the machine.")
    llm_model: str = Field("gpt-4o-mini", min_length=1, max_length=200,
                           description="Chat model name sent to llm_base_url.")
    api_key_secret: str | None = Field(
        None, min_length=1, max_length=200,
        description="Name of the Prefect Secret block holding the endpoint's API key (resolved in the task, "
                    "never logged).")
    llm_timeout_s: float = Field(60.0, gt=0.0, le=600.0, description="Seconds to wait for one LLM reply.")
