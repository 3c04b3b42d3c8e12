"""Views declared as Spark SQL: a definition that returns SQL text reads its inputs as
``{topic}`` placeholders, which Spark binds to the input DataFrames (``spark.sql(text, topic=df)``)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

PLACEHOLDER = re.compile(r"\{(\w+)\}")


def spark_rows(sql: str, inputs: Mapping[str, DataFrame]) -> DataFrame:
    """The SQL run by Spark on the input DataFrames. Inputs of several sessions (a stream's
    micro-batch has its own, a lookup read from a table the main one) meet as global temporary
    views, which every session of the application sees; the plan holds them once analysed."""
    given = {name: inputs[name] for name in set(PLACEHOLDER.findall(sql))}
    session = next(iter(given.values())).sparkSession
    if all(frame.sparkSession is session for frame in given.values()):
        return session.sql(sql, **given)
    names = {name: f"lambdalake_{name}_{uuid.uuid4().hex}" for name in given}
    for name, frame in given.items():
        frame.createGlobalTempView(names[name])
    try:
        return session.sql(PLACEHOLDER.sub(lambda match: f"global_temp.{names[match[1]]}", sql))
    finally:
        for name in names.values():
            session.catalog.dropGlobalTempView(name)
