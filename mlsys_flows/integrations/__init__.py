"""Ways in from other systems: signed webhooks that start flow runs (webhooks) and the Airflow
provider (airflow/). Keep this file free of imports: the Airflow side runs without Prefect."""
