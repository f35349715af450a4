"""The bodies of discovery's API: the HTTP API's request and response models, which the gRPC
door builds from Danube's messages so that both doors hold a value to the same rules."""
