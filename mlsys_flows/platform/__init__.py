"""Services that run and deploy flows: the local Prefect server and worker (server), running a system
(runner), deployments and work-pool job templates (deploy, infra), child processes (procs) and the
Prefect REST client (prefect_rest, httpx only). Keep this file free of imports: the Airflow provider
imports prefect_rest where Prefect is not installed."""
