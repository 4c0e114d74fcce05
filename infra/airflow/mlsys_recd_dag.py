"""An example DAG: recd (arXiv:2211.05239) as an Airflow task, on the Prefect server of the
`prefect_default` connection (docs/platform.md, section 4). Copy it into your DAGs folder, then:

    airflow connections add prefect_default --conn-type prefect --conn-host http://127.0.0.1:4200/api
    airflow dags test mlsys_recd -c '{"scale": "smoke"}'

The task defers while the flow runs (a triggerer waits on the run, no worker slot is held), ends with
the run's final state, links to the run's page in the Prefect UI, and cancels the run if killed.
tests/integration/test_airflow_dags.py runs this file.
"""
from airflow.sdk import DAG, Param

from mlsys_flows.integrations.airflow.operators import MlsysFlowOperator

with DAG("mlsys_recd", schedule=None, catchup=False, tags=["mlsys-flows"],
         params={"scale": Param("quick", enum=["smoke", "quick", "full"], description="the run's scale")}):
    MlsysFlowOperator(task_id="recd", system="recd", scale="{{ params.scale }}", overrides={"seed": 1},
                      poll_interval_s=5)
