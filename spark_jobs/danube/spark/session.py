"""A Spark session for the jobs, with the environment handled: the same code runs from the
``danube`` command (which starts Spark itself, ``local[*]`` by default) and under
``spark-submit`` (which has started it and says where it runs).

What is set, and only when the user has not set it already:

- ``PYSPARK_PYTHON`` and ``PYSPARK_DRIVER_PYTHON``: this interpreter, so Spark's Python
  workers import the same environment (danube, OpenDAL, pyarrow) rather than whatever
  ``python3`` is first on the ``PATH``;
- for a ``local`` master, ``SPARK_LOCAL_IP`` and the driver's bind address and host:
  ``127.0.0.1``, so Spark neither picks a network interface (and warns that the host name
  resolves to a loopback address) nor listens beyond this machine;
- ``spark.sql.session.timeZone``: UTC, so timestamps print and convert the same everywhere.

Under ``spark-submit`` the session exists already (or is configured by its arguments): only
the data source is registered; ``PYSPARK_PYTHON`` is then the submitter's to set
(docs/spark.md).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping

from pyspark.sql import SparkSession

from danube.spark.source import register

DEFAULT_MASTER = "local[*]"
LOOPBACK = "127.0.0.1"


def under_spark_submit(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process is a driver that ``spark-submit`` (or ``pyspark``) started: its
    JVM runs already and its gateway is handed over in the environment."""
    env = os.environ if environ is None else environ
    return "PYSPARK_GATEWAY_PORT" in env


def prepare_environment(
    master: str | None, environ: MutableMapping[str, str] | None = None
) -> dict[str, str]:
    """Set the variables the module docstring lists in ``environ`` (default ``os.environ``);
    return the Spark configuration to add for ``master``."""
    env = os.environ if environ is None else environ
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    conf = {"spark.sql.session.timeZone": "UTC"}
    if master is not None and master.startswith("local"):
        env.setdefault("SPARK_LOCAL_IP", LOOPBACK)
        conf["spark.driver.bindAddress"] = env["SPARK_LOCAL_IP"]
        conf["spark.driver.host"] = env["SPARK_LOCAL_IP"]
    return conf


def spark_session(
    app_name: str = "danube",
    *,
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """A session with ``spark.read.format("danube")`` registered.

    ``master`` is ignored under ``spark-submit`` (its ``--master`` rules); elsewhere it
    defaults to ``local[*]``. ``conf`` is added last.
    """
    builder = SparkSession.builder.appName(app_name)
    if under_spark_submit():
        settings = prepare_environment(None)
    else:
        master = master or DEFAULT_MASTER
        settings = prepare_environment(master)
        builder = builder.master(master)
    for name, value in {**settings, **(conf or {})}.items():
        builder = builder.config(name, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark
