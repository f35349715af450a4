"""Security of the mesh's front doors: TLS and mTLS (:mod:`danube.security.tls`), and a
local certificate authority for one machine (:mod:`danube.security.pki`)."""
