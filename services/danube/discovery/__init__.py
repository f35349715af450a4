"""The discovery service: the public HTTP API of the mesh (docs/http-api.md) and, through an
etcd election among its instances, the cluster controller (docs/controller.md).

``python -m danube.discovery`` runs one instance; any number may run at once and any of
them serves any request.
"""
