"""cloud_reader: serves offset ranges of a partition from its objects in object storage."""
