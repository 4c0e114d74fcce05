"""Prefect's default base job templates, asked of its SDK against the session's test API: the saved
copies of the worker types the project does not install are what Prefect gives now (else run
`python -m mlsys_flows.platform.infra --refresh-defaults`), and the installed ones come from their workers."""
import json

import pytest

from mlsys_flows.platform import infra


@pytest.mark.parametrize("pool_type", [t for t in infra.POOL_TYPES if t not in infra.INSTALLED_WORKERS])
def test_saved_defaults_are_prefects_current_ones(pool_type):
    saved = json.loads((infra.PREFECT_DEFAULTS / f"{pool_type}.json").read_text())
    assert saved == infra.fetch_default_job_template(pool_type), "run `python -m mlsys_flows.platform.infra --refresh-defaults`"


@pytest.mark.parametrize("pool_type", infra.INSTALLED_WORKERS)
def test_installed_workers_give_their_own_default(pool_type):
    assert infra.default_job_template(pool_type) == infra.fetch_default_job_template(pool_type)


def test_an_unknown_pool_type_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="pool type must be one of process, docker"):
        infra.default_job_template("lambda")
