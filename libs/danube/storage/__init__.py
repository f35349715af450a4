"""Object storage through OpenDAL: the store, object names, descriptors and sparse indexes.

- :class:`ObjectStore` (``store``): write, read, range-read, stat, list, delete and a streaming
  writer, every call with a deadline and typed errors; built from a ``wal_cloud.cloud``
  section by :meth:`ObjectStore.from_config` (``backends``: the config → OpenDAL mapping).
- :func:`object_key` / :func:`parse_object_key` (``naming``): keys that sort by offset.
- :class:`ObjectDescriptor` (``descriptor``) and :class:`SparseIndexBuilder` / :func:`seek`
  (``index``): what etcd knows about each object, and how a reader seeks into it.
- :class:`ObjectScan` (``scan``): an object's frames from an offset, every one checked; the
  one reader of objects the cloud_reader and the Spark source share.

docs/storage.md describes backends, naming, descriptors and the index.
"""

from danube.storage.backends import PARTIAL_DIR, open_operator, operator_options, split_root
from danube.storage.descriptor import DESCRIPTOR_VERSION, MAX_DESCRIPTOR_BYTES, ObjectDescriptor
from danube.storage.errors import (
    CorruptDescriptorError,
    CorruptObjectError,
    InvalidDescriptorError,
    InvalidObjectKeyError,
    ListingTooLargeError,
    ObjectNotFoundError,
    ObjectRangeError,
    StorageConfigError,
    StorageError,
    StoragePermissionError,
    StorageTimeoutError,
    StorageUnavailableError,
    UnsupportedDescriptorVersionError,
)
from danube.storage.index import (
    DEFAULT_INDEX_EVERY_BYTES,
    MAX_INDEX_ENTRIES,
    IndexEntry,
    SparseIndexBuilder,
    seek,
)
from danube.storage.naming import (
    OBJECT_SUFFIX,
    ObjectName,
    normalize_root,
    object_key,
    parse_object_key,
    topic_prefix,
)
from danube.storage.scan import ObjectScan
from danube.storage.store import ObjectStore, ObjectWriter

__all__ = [
    "DEFAULT_INDEX_EVERY_BYTES",
    "DESCRIPTOR_VERSION",
    "MAX_DESCRIPTOR_BYTES",
    "MAX_INDEX_ENTRIES",
    "OBJECT_SUFFIX",
    "PARTIAL_DIR",
    "CorruptDescriptorError",
    "CorruptObjectError",
    "IndexEntry",
    "InvalidDescriptorError",
    "InvalidObjectKeyError",
    "ListingTooLargeError",
    "ObjectDescriptor",
    "ObjectName",
    "ObjectNotFoundError",
    "ObjectRangeError",
    "ObjectScan",
    "ObjectStore",
    "ObjectWriter",
    "SparseIndexBuilder",
    "StorageConfigError",
    "StorageError",
    "StoragePermissionError",
    "StorageTimeoutError",
    "StorageUnavailableError",
    "UnsupportedDescriptorVersionError",
    "normalize_root",
    "object_key",
    "open_operator",
    "operator_options",
    "parse_object_key",
    "seek",
    "split_root",
    "topic_prefix",
]
