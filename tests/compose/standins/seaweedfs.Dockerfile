# Stand-in for SeaweedFS's image (chrislusf/seaweedfs:4.47), for the compose smoke on a
# machine with no image registry. NOT SeaweedFS: weed.py answers the two ways
# docker-compose.yml runs the image, with moto's S3 server behind them:
#   s3      command `server ... -s3 -s3.port=8333 -s3.config=...` through the entrypoint
#           (S3 on the -s3.port, /healthz there, the "master" on 9333), healthcheck `wget`;
#   s3-init `/bin/sh -c "echo ... | weed shell -master=s3:9333 | grep -qw ..."`.
# On the smoke's Debian base (its Python), moto[server] in a venv of its own from the smoke's
# wheelhouse, and busybox's wget. Built by tests/compose/smoke_images.py with no network;
# it does not depend on the mesh's source, so the layer cache keeps it between runs.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
COPY requirements.txt /tmp/requirements.txt
COPY wheelhouse/ /tmp/wheelhouse/
RUN python3 -m venv /opt/weed \
 && /opt/weed/bin/pip install --no-cache-dir --disable-pip-version-check --no-index \
        --find-links /tmp/wheelhouse -r /tmp/requirements.txt \
 && rm -rf /tmp/wheelhouse /tmp/requirements.txt
COPY busybox /bin/busybox
COPY weed.py /usr/bin/weed
RUN ln -s /bin/busybox /usr/bin/wget && chmod 0755 /usr/bin/weed && install -d /data
# The real image runs as root and keeps its data in /data.
WORKDIR /data
HEALTHCHECK NONE
ENTRYPOINT ["/usr/bin/weed"]
CMD ["server", "-dir=/data", "-s3"]
