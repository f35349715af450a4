"""The uploader: durable WAL frames to object storage, descriptors and checkpoints to etcd."""
