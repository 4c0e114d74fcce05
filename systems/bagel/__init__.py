"""BAGEL: budgeted passage retrieval as global optimization. A query-specific Gaussian process over
passage embeddings, fitted to relevance scores, seeded by the dense retriever's top hits, then GP-UCB
until the scoring budget is spent; vs reranking the retriever's top-B with the same budget. The scorer
is a noisy label oracle (offline default) or an OpenAI-compatible LLM endpoint (``llm_base_url``, on
the MiniLM-embedded text corpus)."""
from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from mlsys_flows.systems.common.lazy import lazy_exports
from mlsys_flows.systems.common.llm_params import LLMEndpointParams
from mlsys_flows.systems.common.params import FieldValueError, SystemParams
from mlsys_flows.systems.common.spec import Claim, Mechanism, Regime, SystemSpec

if TYPE_CHECKING:
    from .gp import BagelConfig

# the GP, the retrieval experiment, the corpora and the LLM judge (numpy, scipy, httpx) load on first use,
# not with the spec
lazy_exports(__name__, {
    ".evaluate": ("METHODS", "calibrate", "evaluate_queries", "outside_top_b", "summarize"),
    ".adaptive": ("corpus_graph", "gar"),
    ".gp": ("BagelConfig", "BagelTrace", "GPHyper", "bagel", "dense_rank", "final_ranking", "fit_hyper",
            "gp_posterior", "lengthscale_grid", "log_marginal_likelihood", "rbf", "recall_at_k", "rerank_top_b",
            "ucb_beta", "ucb_pick"),
    ".scorers": ("LLMJudge", "parse_relevance"),
    ".text": ("ASPECTS", "TextCorpus", "make_corpus", "query_text", "text_queries"),
    ".workload": ("Query", "digits_embeddings", "make_queries", "noisy_oracle"),
})

# the minilm corpus's cities (systems/bagel/text.py writes passages about each)
CITIES = ("Lisbon", "Oslo", "Nairobi", "Kyoto", "Lima", "Krakow", "Marrakesh", "Montreal", "Hanoi", "Seville",
          "Tbilisi", "Adelaide", "Valparaiso", "Bergen", "Cusco", "Dubrovnik", "Porto", "Tallinn", "Osaka", "Quito")


class Params(LLMEndpointParams, SystemParams):
    SYSTEM: ClassVar[str] = "bagel"
    PRESETS: ClassVar[dict] = {
        # smoke keeps the digits workload (no model to load: seconds); quick and full run on the MiniLM corpus
        "smoke": dict(queries=4, budget=10, budget_points=2, trials=3, regime_per_cluster=[5, 20], regime_queries=4,
                      embedding="digits", calibration_queries=3, beta_grid=[0.1, 0.4], gar_batches=[5],
                      gar_neighbours=[4, 8]),
        # 6 seeds can decide; per_cluster 40 would mean embedding 5120 passages (over a minute on 2 cores)
        "quick": dict(queries=16, budget=30, budget_points=6, trials=6, regime_queries=8, regime_per_cluster=[5, 10, 20]),
        "full": dict(queries=200, budget=40, budget_points=8, trials=3, regime_queries=50, calibration_queries=50),
    }

    queries: int = Field(16, ge=2, le=10_000, description="Queries evaluated per trial (each with its own two relevant clusters).")
    trials: int = Field(3, ge=1, le=20, description="Workload seeds (seed, seed+1, ...), each drawing its own queries; the "
                        "corpus is one per run (minilm: embedded once, seed = the run's seed; digits: the fixed digits "
                        "set), so the trials share it and may draw the same query; the headline variants carry one "
                        "sample per trial (the mean over its queries).")
    regime_per_cluster: list[int] = Field([5, 10, 20, 40], min_length=2, max_length=12,
                                          description="Relevant passages per cluster at each point of the regime sweep "
                                                      "(k = 2 x per_cluster): the more relevant passages, the larger their "
                                                      "share outside the retriever's top-B, which no reranking can reach.")
    regime_queries: int = Field(8, ge=1, le=10_000, description="Queries per regime point (first trial's seed).")
    budget: int = Field(30, ge=2, le=500, description="Scorer calls per query of the headline (B): BAGEL's and the reranker's.")
    budget_points: int = Field(6, ge=1, le=20, description="Budgets of the recall-vs-budget curve, evenly spaced up to max(budget, 2 * budget) (the headline budget is always one).")
    top_k: int | None = Field(None, ge=1, le=1000, description="k of recall@k; None: the number of relevant passages (2 x per_cluster).")
    dim: int = Field(16, ge=2, le=64, description="PCA dimensions of the digit embeddings.")
    normalize: bool = Field(True, description="Scale every embedding to unit length (cosine geometry, as a text embedder gives); False: raw PCA coordinates.")
    per_cluster: int = Field(10, ge=1, le=100, description="Relevant passages per cluster (nearest the cluster centre).")
    relevance_width: float = Field(1.0, gt=0.0, le=10.0, description="A relevant class's passages are graded exp(-ln2 (d/h)^2), d their distance to the class centre, h this many class radii; other classes score 0.")
    query_noise: float = Field(0.15, ge=0.0, le=5.0, description="Offset of the query from a relevant passage of its cluster (per-dimension RMS units).")
    far_quantile: float = Field(0.5, ge=0.0, le=0.99, description="The two relevant classes are drawn from centroid pairs at least this quantile of all pair distances apart.")
    score_noise: float = Field(0.05, ge=0.0, le=1.0, description="Standard deviation of the offline oracle's score noise (scores clipped to [0, 1]).")
    seeds: int = Field(5, ge=1, le=100, description="Dense retriever top hits BAGEL scores first.")
    beta_scale: float | None = Field(None, ge=0.0, le=10.0, description="Factor on the GP-UCB weight sqrt(beta_t), beta_t = 2 log(N t^2 pi^2 / (6 delta)); None: tuned over beta_grid on the calibration queries (the report's notes give the value chosen).")
    beta_grid: list[float] = Field([0.05, 0.1, 0.2, 0.4, 0.8], min_length=1, max_length=12,
                                   description="UCB factors tried on the calibration queries when beta_scale is None (0, exploitation only, is the mechanism's ablation and not tried).")
    calibration_queries: int = Field(8, ge=1, le=1000, description="Calibration queries of each workload: drawn with their own seed, none with an evaluated query's relevant set (minilm: the same city and unordered aspect pair; digits: the same embedding); BAGEL's UCB factor and GAR's batch and graph size are tuned on them (offline oracle), never on the evaluated queries.")
    gar_batches: list[int] = Field([5, 10, 15], min_length=1, max_length=8, description="GAR batch sizes tried on the calibration queries (one value: fixed).")
    gar_neighbours: list[int] = Field([4, 8, 16], min_length=1, max_length=8, description="GAR corpus-graph neighbours per passage tried on the calibration queries (one value: fixed).")
    explore_beta_scale: float | None = Field(None, ge=0.0, le=10.0, description="UCB factor of the bagel_explore variant (BAGEL with more exploration, an ablation); None: twice headline BAGEL's (tuned) factor.")
    beta_delta: float = Field(0.1, gt=0.0, lt=1.0, description="delta of the GP-UCB beta_t schedule.")
    signal_var: float = Field(0.25, gt=0.0, le=10.0, description="GP prior variance of a passage's relevance (scores lie in [0, 1]).")
    refit_every: int = Field(5, ge=1, le=100, description="Refit the length scale and noise (type-II ML over a grid set from the embedding distances) every this many scores.")
    embedding: Literal["digits", "minilm"] = Field("minilm", description="Headline workload (the other one, digits, is a second claim: digits_* variants): digits = sklearn digits PCA embeddings (no text); minilm = a generated text corpus (cities x aspects, per_cluster passages per pair) embedded with the packaged MiniLM model, offline.")
    cities: int = Field(16, ge=2, le=len(CITIES), description="minilm corpus: cities, each with per_cluster passages on each of the 8 aspects.")
    same_city: float = Field(0.3, ge=0.0, le=1.0, description="minilm oracle: graded relevance of the query's city under an aspect the query does not ask about.")
    same_aspect: float = Field(0.1, ge=0.0, le=1.0, description="minilm oracle: graded relevance of another city under one of the query's two aspects.")
    llm_max_failed: float = Field(0.2, ge=0.0, le=1.0, description="Abort when more than this share of LLM scoring requests failed (after 10); fewer failed scores count as relevance 0 and are reported.")

    @field_validator("regime_per_cluster")
    @classmethod
    def _per_cluster(cls, v: list[int]) -> list[int]:
        if any(not 1 <= x <= 100 for x in v) or len(set(v)) != len(v):
            raise ValueError("relevant passages per cluster must be distinct, each from 1 to 100")
        return sorted(v)

    @field_validator("beta_grid")
    @classmethod
    def _beta_grid(cls, v: list[float]) -> list[float]:
        if any(not 0.0 < x <= 10.0 for x in v) or len(set(v)) != len(v):
            raise ValueError("UCB factors must be distinct, each in (0, 10]")
        return v

    @field_validator("gar_batches", "gar_neighbours")
    @classmethod
    def _gar(cls, v: list[int]) -> list[int]:
        if any(not 1 <= x <= 200 for x in v) or len(set(v)) != len(v):
            raise ValueError("values must be distinct, each from 1 to 200")
        return v

    @model_validator(mode="after")
    def _consistent(self):
        if self.llm_base_url and self.embedding != "minilm":
            raise FieldValueError("llm_base_url", "the LLM scorer grades text: set embedding='minilm' (the digits "
                                                  "corpus has no text)")
        if self.seeds > self.budget:
            raise ValueError(f"seeds ({self.seeds}) must not exceed budget ({self.budget})")
        return self

    def budgets(self) -> list[int]:
        import numpy as np
        top = 2 * self.budget if self.budget_points > 1 else self.budget
        pts = {int(round(b)) for b in np.linspace(top / self.budget_points, top, self.budget_points)} | {self.budget}
        return sorted(b for b in pts if b >= 1)

    def workload(self, trial: int = 0, per_cluster: int | None = None, queries: int | None = None, embed=None) -> dict:
        """{'X', 'queries'} (and the texts for minilm) of one trial: seed + trial, ``per_cluster`` relevant
        passages per cluster (default: the parameter). ``embed``: the text embedder (minilm only)."""
        per, n, seed = per_cluster or self.per_cluster, queries or self.queries, self.seed + trial
        if self.embedding == "minilm":
            from .text import text_workload
            return text_workload(self.cities, per, n, self.far_quantile, self.same_city, self.same_aspect, seed, embed)
        from .workload import digits_embeddings, make_queries

        X, labels = digits_embeddings(self.dim, self.normalize)
        return {"X": X, "queries": make_queries(X, labels, n, per, self.query_noise, self.far_quantile,
                                                self.relevance_width, seed)}

    def config(self, beta_scale: float | None = None) -> BagelConfig:
        """BAGEL's configuration with UCB factor ``beta_scale`` (None: the parameter; when that is None
        too, the first value of beta_grid: tune it with plan.tune first)."""
        from .gp import BagelConfig

        beta = beta_scale if beta_scale is not None else (
            self.beta_scale if self.beta_scale is not None else self.beta_grid[0])
        return BagelConfig(seeds=self.seeds, beta_scale=beta, beta_delta=self.beta_delta,
                           signal_var=self.signal_var, refit_every=self.refit_every)


SPEC = SystemSpec(
    name="bagel", title="BAGEL: budgeted retrieval by Gaussian-process search", paper="arXiv:2604.17906", family="llm-serving",
    params=Params, baselines=("rerank", "gar", "dense"),
    roles={"rerank": ("paper", "deployable"), "gar": ("deployable",), "dense": ("deployable",)},
    # counted against the relevance known by construction, whichever scorer (label oracle or LLM) graded
    kinds=dict.fromkeys(("recall_at_k", "far_recall_at_k", "recall_p10", "recall_p90", "queries", "scorer_calls",
                         "failed_scores"), "counted"),
    mechanism=Mechanism(
        "budgeted exploration beyond the retriever's top-B", "bagel_exploit",
        "bagel_exploit is BAGEL with the same seeds, GP, hyperparameter fits, budget and final ranking, but a UCB "
        "weight of 0: each call scores the passage with the highest posterior mean (exploitation only), so the "
        "GP's uncertainty never directs a call."),
    regime=Regime(
        "per_cluster", "relevant passages per cluster", None, "",
        "The share of relevant passages outside the retriever's top-B: reranking the top-B can only reorder what the "
        "retriever returned, while BAGEL may score any passage. With few relevant passages (k below B) they mostly "
        "sit inside the top-B and reranking is hard to beat; with many (k above B) most lie beyond it. The sweep "
        "varies the relevant passages per cluster at a fixed budget; the notes give the measured share outside the "
        "top-B at each point. The paper states no single value."),
    claims=(
        Claim("recall_at_k", "rerank", "bagel", "higher", None,
              "beats LLM reranking of the retriever's top-B at equal budget on four datasets (here: recall@k at "
              "budget B, mean over queries, one sample per trial, noisy label oracle as the scorer)", headline=True),
        Claim("recall_at_k", "gar", "bagel", "higher",
              statement="against graph-based adaptive re-ranking (GAR, MacAvaney et al. CIKM 2022: batches alternate "
                        "between the dense ranking and the corpus-graph neighbours of the best-scored passages) at "
                        "equal budget, its batch and graph size tuned on calibration queries"),
        Claim("recall_at_k", "dense", "bagel", "higher", statement="against the dense retriever alone (no scorer calls)"),
        Claim("recall_at_k", "rerank", "bagel_explore", "higher",
              statement="BAGEL with a larger UCB exploration weight (explore_beta_scale) vs rerank at equal budget"),
        Claim("far_recall_at_k", "rerank", "bagel_explore", "higher",
              statement="far-cluster recall of the more exploring BAGEL (does exploration reach the second cluster?)"),
        Claim("far_recall_at_k", "rerank", "bagel", "higher",
              statement="share of the far cluster's relevant passages in the top k (the dense neighbourhood misses them)"),
        Claim("far_recall_at_k", "bagel_exploit", "bagel", "higher",
              statement="far-cluster recall with and without exploration (the mechanism on the far cluster)"),
        Claim("recall_at_k", "digits_rerank", "digits_bagel", "higher",
              statement="the second workload (sklearn digits in 16 PCA dims, two distant digit classes per query): "
                        "BAGEL vs rerank at equal budget, BAGEL's UCB factor tuned on that workload's own calibration "
                        "queries"),
        Claim("recall_at_k", "digits_gar", "digits_bagel", "higher",
              statement="the second workload (digits): BAGEL vs GAR at equal budget"),
    ),
)
__all__ = ["Params", "SPEC", "calibrate", "corpus_graph", "gar", "BagelConfig", "BagelTrace", "GPHyper", "bagel", "dense_rank", "final_ranking", "fit_hyper",
           "gp_posterior", "lengthscale_grid", "log_marginal_likelihood", "rbf", "recall_at_k", "rerank_top_b",
           "ucb_beta", "ucb_pick", "Query", "digits_embeddings", "make_queries", "noisy_oracle", "METHODS",
           "evaluate_queries", "outside_top_b", "summarize", "LLMJudge", "parse_relevance", "ASPECTS", "CITIES", "TextCorpus",
           "make_corpus", "query_text", "text_queries"]
