"""``value_info.json``, the Caffe2 model zoo's input shapes beside a net
(``placer.formats.read_value_info``): ``{blob: [data_type, [d0, d1, ...]]}`` with
TensorProto.DataType numbers. Data types and dimensions are checked after the model."""
from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field, RootModel

from placer.documents import Integer

VALUE_INFO_FORM = '{blob: [data_type, [d0, d1, ...]]}, e.g. {"data": [1, [1, 3, 224, 224]]}'

Entry = Annotated[tuple[Integer, list[Integer]], Field(description="[data_type, [d0, d1, ...]] with integers")]


class ValueInfo(RootModel[dict[str, Entry]]):
    """Each blob's [data_type, shape]."""

    model_config = ConfigDict(title="Caffe2 model-zoo value_info.json", defer_build=True,
                              json_schema_extra={"description": VALUE_INFO_FORM})


__all__ = ["VALUE_INFO_FORM", "ValueInfo"]
