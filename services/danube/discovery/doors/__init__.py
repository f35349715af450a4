"""The doors of discovery (DESIGN §10): HTTP, gRPC and the console, siblings over the core
(danube.discovery.core), and the bodies they share (doors.bodies). A door only translates:
decode, call the core, encode, answer an error by its kind."""
