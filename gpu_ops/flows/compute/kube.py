"""The ``kubernetes`` client boundary, shared by the flows that reach the cluster. The client
is imported when called.

Design: docs/concepts/compute.md#the-cluster-client
"""

from __future__ import annotations

from typing import Any, Callable

TOLERATED = object()  # what api_call returns when the API server answered the tolerated status


def api_call(call: Callable[..., Any], *args: Any, tolerate: int, **kwargs: Any) -> Any:
    """``call(*args, **kwargs)``, or :data:`TOLERATED` when it raises an ``ApiException``
    with status ``tolerate``; any other error propagates."""
    from kubernetes.client.exceptions import ApiException

    try:
        return call(*args, **kwargs)
    except ApiException as exc:
        if exc.status != tolerate:
            raise
    return TOLERATED


def load_cluster_config(
    kubeconfig: str | None = None,
    *,
    context: str | None = None,
    explain: Callable[[Exception], Exception] | None = None,
) -> None:
    """Load the process-wide ``kubernetes`` client configuration.

    ``kubeconfig``/``context`` name a kubeconfig file and context: when given, only they are
    used. Otherwise the service account is tried, and ``$KUBECONFIG`` / ``~/.kube/config``
    when the process is not in a pod. A failure propagates, or ``explain(error)`` is raised
    in its place.
    """
    from kubernetes import config

    def from_kubeconfig() -> None:
        config.load_kube_config(config_file=kubeconfig, context=context)

    try:
        if kubeconfig or context:
            from_kubeconfig()
            return
        try:
            config.load_incluster_config()
        except config.ConfigException:  # not in a pod
            from_kubeconfig()
    except Exception as exc:
        if explain is None:
            raise
        raise explain(exc) from None
