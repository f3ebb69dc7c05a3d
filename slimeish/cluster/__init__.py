"""`slimeish train --launcher ray`: the run's parts placed on a Ray cluster (docs/cluster.md).

Ray is an optional dependency (`pip install 'slimeish[ray]'`): only
`slimeish.cluster.launch`, `.part` and `.ranks` import it, and only a run with `--launcher ray`
imports them.
"""

from slimeish.cluster.config import ClusterConfig

__all__ = ["ClusterConfig"]
