"""Re-exports ckptvault_prefect/deployments/serve.py; `python -m deployments.serve` serves the seven."""

from ckptvault_prefect.deployments.serve import *  # noqa: F403
from ckptvault_prefect.deployments.serve import serve_all

if __name__ == "__main__":
    serve_all()
