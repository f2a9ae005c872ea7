"""Conformance cases for the data-movement, embedding, fill and copy op families, as data.

Each case: ``id``, Caffe2 ``op`` type, ``args``, ``inputs`` (specs below; random values
come from a generator seeded by the case id), ``ref`` (the name of an independent
PyTorch reference in tests/test_ops_data.py) and optionally ``n_outputs`` (outputs the
op declares), ``tol``, ``index`` (for Slice: the Python slice the Caffe2 bounds mean) and
``target`` (for Reshape: the shape Caffe2's 0/-1 rule gives), both written out by hand
from Caffe2's documentation.
"""


def randn(*shape, dtype="float32"):
    return {"kind": "randn", "shape": shape, "dtype": dtype}


def randint(low, high, *shape, dtype="int64"):
    """Integers in [low, high)."""
    return {"kind": "randint", "shape": shape, "dtype": dtype, "low": low, "high": high}


def given(values, dtype="int32"):
    return {"kind": "given", "values": values, "dtype": dtype}


def fused_table(rows, dim):
    """uint8 rows: dim quantized values, then float32 scale and float32 bias."""
    return {"kind": "fused8bit", "shape": (rows, dim), "dtype": "uint8"}


def _sls(id, lengths, rows=20, dim=4, index_dtype="int64", op="SparseLengthsSum", dtype="float32",
         ref="embedding_bag_sum", weighted=False):
    n = sum(lengths)
    inputs = [randn(rows, dim, dtype=dtype)]
    if weighted:
        inputs.append(randn(n))
    inputs += [randint(0, rows, n, dtype=index_dtype), given(lengths, "int32")]
    return dict(id=id, op=op, args={}, inputs=inputs, ref=ref)


S = slice(None)

CASES = [
    # ------------------------------------------------------------ Concat / Split
    dict(id="concat_axis1", op="Concat", args={"axis": 1},
         inputs=[randn(2, 3, 4), randn(2, 5, 4), randn(2, 1, 4)], ref="concat"),
    dict(id="concat_default_order", op="Concat", args={}, inputs=[randn(2, 3, 2, 2), randn(2, 4, 2, 2)],
         ref="concat"),
    dict(id="concat_nhwc", op="Concat", args={"order": "NHWC"},
         inputs=[randn(1, 2, 2, 3), randn(1, 2, 2, 5)], ref="concat"),
    dict(id="concat_neg_axis", op="Concat", args={"axis": -1}, inputs=[randn(3, 2), randn(3, 6)],
         ref="concat"),
    dict(id="concat_add_axis", op="Concat", args={"axis": 1, "add_axis": 1},
         inputs=[randn(4, 8), randn(4, 8), randn(4, 8)], ref="concat"),
    dict(id="concat_add_axis_last", op="Concat", args={"axis": -1, "add_axis": 1},
         inputs=[randn(4, 8), randn(4, 8)], ref="concat"),
    dict(id="concat_int64", op="Concat", args={"axis": 0},
         inputs=[randint(0, 9, 3, dtype="int64"), randint(0, 9, 2, dtype="int64")], ref="concat"),
    dict(id="depth_concat", op="DepthConcat", args={"order": "NCHW"}, inputs=[randn(1, 2, 3, 3), randn(1, 4, 3, 3)],
         ref="concat"),
    dict(id="depth_split", op="DepthSplit", args={"split": [3, 1]}, inputs=[randn(1, 4, 2, 2)], ref="split",
         n_outputs=2),
    dict(id="split_args", op="Split", args={"axis": 1, "split": [1, 3, 2]}, inputs=[randn(2, 6, 3)],
         ref="split", n_outputs=3),
    dict(id="split_uneven", op="Split", args={"axis": 0, "split": [5, 2]}, inputs=[randn(7, 2)],
         ref="split", n_outputs=2),
    dict(id="split_equal", op="Split", args={"axis": 1}, inputs=[randn(3, 8)], ref="split", n_outputs=4),
    dict(id="split_equal_order", op="Split", args={}, inputs=[randn(2, 6, 2, 2)], ref="split", n_outputs=2),
    dict(id="split_input", op="Split", args={"axis": 0}, inputs=[randn(9, 2), given([4, 0, 5])],
         ref="split", n_outputs=3),
    dict(id="split_add_axis", op="Split", args={"axis": 1, "add_axis": 1}, inputs=[randn(2, 3, 4)],
         ref="split", n_outputs=3),

    # ------------------------------------------------------------ Reshape family
    dict(id="reshape_zero_minus1", op="Reshape", args={"shape": [0, -1]}, inputs=[randn(2, 3, 4)],
         ref="reshape", target=(2, 12)),
    dict(id="reshape_minus1_first", op="Reshape", args={"shape": [-1, 6]}, inputs=[randn(2, 3, 4)],
         ref="reshape", target=(4, 6)),
    dict(id="reshape_zero_middle", op="Reshape", args={"shape": [4, 0, 2]}, inputs=[randn(2, 3, 4)],
         ref="reshape", target=(4, 3, 2)),
    dict(id="reshape_more_dims", op="Reshape", args={"shape": [2, 3, 2, 2]}, inputs=[randn(6, 4)],
         ref="reshape", target=(2, 3, 2, 2)),
    dict(id="reshape_input_int64", op="Reshape", args={}, inputs=[randn(2, 3, 4), given([0, 2, -1], "int64")],
         ref="reshape", target=(2, 2, 6)),
    dict(id="reshape_input_int32", op="Reshape", args={}, inputs=[randn(2, 6), given([3, 4], "int32")],
         ref="reshape", target=(3, 4)),
    dict(id="flatten_default", op="Flatten", args={}, inputs=[randn(2, 3, 4, 5)], ref="flatten"),
    dict(id="flatten_axis0", op="Flatten", args={"axis": 0}, inputs=[randn(2, 3)], ref="flatten"),
    dict(id="flatten_axis2", op="Flatten", args={"axis": 2}, inputs=[randn(2, 3, 4, 5)], ref="flatten"),
    dict(id="flatten_to_vec", op="FlattenToVec", args={}, inputs=[randn(2, 3, 4)], ref="flatten_to_vec"),
    dict(id="resize_like", op="ResizeLike", args={}, inputs=[randn(6, 4), randn(2, 3, 4)], ref="resize_like"),
    dict(id="transpose_default", op="Transpose", args={}, inputs=[randn(2, 3, 4)], ref="transpose"),
    dict(id="transpose_axes", op="Transpose", args={"axes": [0, 2, 3, 1]}, inputs=[randn(2, 3, 4, 5)],
         ref="transpose"),
    dict(id="squeeze", op="Squeeze", args={"dims": [1, 3]}, inputs=[randn(2, 1, 3, 1)], ref="squeeze"),
    dict(id="squeeze_unsorted", op="Squeeze", args={"dims": [2, 0]}, inputs=[randn(1, 4, 1)], ref="squeeze"),
    dict(id="expand_dims", op="ExpandDims", args={"dims": [0, 2]}, inputs=[randn(3, 4)], ref="expand_dims"),
    dict(id="expand_dims_end", op="ExpandDims", args={"dims": [2]}, inputs=[randn(3, 4)], ref="expand_dims"),

    # ------------------------------------------------------------ Slice (Caffe2: negative b = dim + 1 + b)
    dict(id="slice_dim1", op="Slice", args={"starts": [0, 1], "ends": [-1, 3]}, inputs=[randn(2, 5, 3)],
         ref="slice", index=(S, slice(1, 3))),
    dict(id="slice_end_minus1", op="Slice", args={"starts": [2], "ends": [-1]}, inputs=[randn(6, 2)],
         ref="slice", index=(slice(2, 6),)),
    dict(id="slice_end_minus2", op="Slice", args={"starts": [0, 0, 1], "ends": [-1, -1, -2]},
         inputs=[randn(2, 3, 5)], ref="slice", index=(S, S, slice(1, 4))),
    dict(id="slice_neg_start", op="Slice", args={"starts": [-3], "ends": [-1]}, inputs=[randn(5, 2)],
         ref="slice", index=(slice(3, 5),)),
    dict(id="slice_clipped", op="Slice", args={"starts": [0, 2], "ends": [-1, 100]}, inputs=[randn(2, 4)],
         ref="slice", index=(S, slice(2, 4))),
    dict(id="slice_inputs", op="Slice", args={}, inputs=[randn(3, 6), given([0, 1], "int64"),
                                                         given([-1, 4], "int64")],
         ref="slice", index=(S, slice(1, 4))),

    # ------------------------------------------------------------ gathers
    dict(id="gather_int32", op="Gather", args={}, inputs=[randn(10, 4), randint(0, 10, 6, dtype="int32")],
         ref="gather"),
    dict(id="gather_int64_2d_idx", op="Gather", args={},
         inputs=[randn(10, 3, 2), randint(0, 10, 2, 5, dtype="int64")], ref="gather"),
    dict(id="gather_axis1", op="Gather", args={"axis": 1}, inputs=[randn(3, 7, 2), randint(0, 7, 4)],
         ref="gather"),
    dict(id="gather_1d_data", op="Gather", args={}, inputs=[randn(12), randint(0, 12, 5)], ref="gather"),
    dict(id="batch_gather", op="BatchGather", args={}, inputs=[randn(4, 9), randint(0, 9, 5, dtype="int32")],
         ref="batch_gather"),
    dict(id="batch_gather_2d_idx", op="BatchGather", args={},
         inputs=[randn(3, 6, 2), randint(0, 6, 2, 4, dtype="int64")], ref="batch_gather"),

    # ------------------------------------------------------------ ChannelShuffle, Shape, Size, Tile
    dict(id="shuffle_g2", op="ChannelShuffle", args={"group": 2}, inputs=[randn(2, 6, 3, 3)],
         ref="channel_shuffle"),
    dict(id="shuffle_g3", op="ChannelShuffle", args={"group": 3}, inputs=[randn(1, 12, 2, 5)],
         ref="channel_shuffle"),
    dict(id="shuffle_g4_nhwc", op="ChannelShuffle", args={"group": 4, "order": "NHWC"},
         inputs=[randn(2, 3, 3, 8)], ref="channel_shuffle"),
    dict(id="shuffle_g1", op="ChannelShuffle", args={"group": 1}, inputs=[randn(1, 5, 2, 2)],
         ref="channel_shuffle"),
    dict(id="shape", op="Shape", args={}, inputs=[randn(2, 3, 4)], ref="shape"),
    dict(id="shape_axes", op="Shape", args={"axes": [2, 0]}, inputs=[randn(2, 3, 4)], ref="shape"),
    dict(id="size", op="Size", args={}, inputs=[randn(2, 3, 4)], ref="size"),
    dict(id="tile_axis1", op="Tile", args={"tiles": 3, "axis": 1}, inputs=[randn(2, 2, 3)], ref="tile"),
    dict(id="tile_default_axis", op="Tile", args={"tiles": 2}, inputs=[randn(3, 2)], ref="tile"),
    dict(id="tile_inputs", op="Tile", args={}, inputs=[randn(2, 2, 3), given([3], "int64"), given([1], "int32")],
         ref="tile"),

    # ------------------------------------------------------------ SparseLengths* (embedding_bag)
    _sls("sls_basic_int64", [3, 1, 4, 2]),
    _sls("sls_int32", [2, 2, 2], index_dtype="int32"),
    _sls("sls_empty_first_last", [0, 3, 0, 0, 2, 0], index_dtype="int32"),
    _sls("sls_all_empty", [0, 0, 0]),
    _sls("sls_no_segments", []),
    _sls("sls_single_rows", [1] * 7, rows=5),
    _sls("sls_float64", [2, 0, 3], dtype="float64"),
    _sls("sls_float16", [2, 0, 3, 1, 0], dtype="float16"),
    _sls("sls_wide", [8] * 16, rows=1000, dim=64),
    _sls("sls_mean", [3, 0, 1, 4], op="SparseLengthsMean", ref="embedding_bag_mean"),
    _sls("sls_mean_int32", [0, 2, 5], op="SparseLengthsMean", ref="embedding_bag_mean", index_dtype="int32"),
    _sls("sls_mean_float16", [0, 2, 5], op="SparseLengthsMean", ref="embedding_bag_mean", dtype="float16"),
    _sls("slws", [2, 0, 3, 1], op="SparseLengthsWeightedSum", ref="embedding_bag_weighted", weighted=True),
    _sls("slws_int32_empty_end", [4, 1, 0], op="SparseLengthsWeightedSum", ref="embedding_bag_weighted",
         weighted=True, index_dtype="int32"),
    _sls("slws_float16", [3, 0, 2], op="SparseLengthsWeightedSum", ref="embedding_bag_weighted",
         weighted=True, dtype="float16"),
    dict(id="sls_3d_table", op="SparseLengthsSum", args={},
         inputs=[randn(8, 2, 3), randint(0, 8, 5), given([2, 0, 3])], ref="embedding_bag_sum"),
    dict(id="sls_fused8bit", op="SparseLengthsSumFused8BitRowwise", args={},
         inputs=[fused_table(12, 5), randint(0, 12, 7), given([3, 0, 4])], ref="fused_sum"),
    dict(id="sls_fused8bit_int32_empty_first", op="SparseLengthsSumFused8BitRowwise", args={},
         inputs=[fused_table(6, 3), randint(0, 6, 4, dtype="int32"), given([0, 4, 0])], ref="fused_sum"),
    dict(id="slws_fused8bit", op="SparseLengthsWeightedSumFused8BitRowwise", args={},
         inputs=[fused_table(9, 4), randn(5), randint(0, 9, 5), given([2, 3])], ref="fused_weighted"),
    dict(id="sls_mean_fused8bit", op="SparseLengthsMeanFused8BitRowwise", args={},
         inputs=[fused_table(9, 4), randint(0, 9, 6), given([2, 0, 4])], ref="fused_mean"),
    dict(id="lengths_sum", op="LengthsSum", args={}, inputs=[randn(7, 3), given([2, 0, 4, 1])],
         ref="lengths_sum"),
    dict(id="lengths_sum_3d_empty_end", op="LengthsSum", args={}, inputs=[randn(5, 2, 2), given([0, 5, 0])],
         ref="lengths_sum"),
    dict(id="lengths_mean", op="LengthsMean", args={}, inputs=[randn(6, 4), given([3, 0, 3])],
         ref="lengths_mean"),
    dict(id="lengths_sum_int64_lengths", op="LengthsSum", args={},
         inputs=[randn(4, 2), given([1, 3], "int64")], ref="lengths_sum"),
    dict(id="lengths_max", op="LengthsMax", args={}, inputs=[randn(7, 3), given([2, 0, 4, 1])],
         ref="segment_max"),
    dict(id="lengths_max_empty_end", op="LengthsMax", args={}, inputs=[randn(3, 2, 2), given([3, 0])],
         ref="segment_max"),
    dict(id="sorted_segment_sum_gap", op="SortedSegmentSum", args={},
         inputs=[randn(6, 3), given([0, 0, 2, 2, 2, 4])], ref="segment_sum"),
    dict(id="sorted_segment_mean", op="SortedSegmentMean", args={},
         inputs=[randn(5, 2), given([1, 1, 1, 2, 3], "int64")], ref="segment_mean"),
    dict(id="sorted_segment_range_sum", op="SortedSegmentRangeSum", args={},
         inputs=[randn(5, 2, 2), given([0, 1, 1, 2, 2])], ref="segment_sum"),
    dict(id="sorted_segment_range_mean", op="SortedSegmentRangeMean", args={},
         inputs=[randn(6, 4), given([0, 0, 0, 1, 2, 2])], ref="segment_mean"),
    dict(id="sorted_segment_range_max", op="SortedSegmentRangeMax", args={},
         inputs=[randn(6, 4), given([0, 0, 1, 1, 1, 2])], ref="segment_max"),
    dict(id="sorted_segment_range_max_single_rows", op="SortedSegmentRangeMax", args={},
         inputs=[randn(3, 2), given([0, 1, 2])], ref="segment_max"),
    dict(id="sorted_segment_range_logsumexp", op="SortedSegmentRangeLogSumExp", args={},
         inputs=[randn(7, 3), given([0, 0, 1, 1, 1, 3, 3])], ref="segment_logsumexp"),
    dict(id="sorted_segment_range_logmeanexp", op="SortedSegmentRangeLogMeanExp", args={},
         inputs=[randn(7, 3), given([0, 1, 1, 1, 2, 2, 2])], ref="segment_logmeanexp"),
    dict(id="lengths_to_segment_ids", op="LengthsToSegmentIds", args={}, inputs=[given([0, 2, 0, 3, 1, 0])],
         ref="segment_ids"),
    dict(id="lengths_to_ranges", op="LengthsToRanges", args={}, inputs=[given([2, 0, 3, 1])],
         ref="ranges"),
    dict(id="lengths_to_segment_ids_empty", op="LengthsToSegmentIds", args={}, inputs=[given([0, 0])],
         ref="segment_ids"),

    # ------------------------------------------------------------ fills with given values
    dict(id="constant_fill_shape", op="ConstantFill", args={"shape": [2, 3], "value": 1.5}, inputs=[],
         ref="constant_fill"),
    dict(id="constant_fill_int_value", op="ConstantFill", args={"shape": [4], "value": 7}, inputs=[],
         ref="constant_fill"),
    dict(id="constant_fill_dtype_int32", op="ConstantFill", args={"shape": [2], "value": 3, "dtype": 2},
         inputs=[], ref="constant_fill"),
    dict(id="constant_fill_like_input", op="ConstantFill", args={"value": 2.0}, inputs=[randn(3, 2)],
         ref="constant_fill"),
    dict(id="constant_fill_extra_shape", op="ConstantFill", args={"extra_shape": [5]}, inputs=[randn(2)],
         ref="constant_fill"),
    dict(id="constant_fill_input_as_shape", op="ConstantFill", args={"input_as_shape": 1, "value": 4.0},
         inputs=[given([2, 4], "int64")], ref="constant_fill"),
    dict(id="constant_fill_bool", op="ConstantFill", args={"shape": [3], "value": 1, "dtype": 5}, inputs=[],
         ref="constant_fill"),
    dict(id="given_fill", op="GivenTensorFill", args={"shape": [2, 2], "values": [1.0, -2.5, 3.0, 4.25]},
         inputs=[], ref="given_fill"),
    dict(id="given_fill_no_shape", op="GivenTensorFill", args={"values": [0.5, 1.5, 2.5]}, inputs=[],
         ref="given_fill"),
    dict(id="given_int_fill", op="GivenTensorIntFill", args={"shape": [3], "values": [1, -2, 3]}, inputs=[],
         ref="given_fill"),
    dict(id="given_int64_fill", op="GivenTensorInt64Fill", args={"shape": [1, 2], "values": [2**40, -1]},
         inputs=[], ref="given_fill"),
    dict(id="given_double_fill", op="GivenTensorDoubleFill", args={"values": [0.1, 1e-300]}, inputs=[],
         ref="given_fill"),
    dict(id="given_int16_fill", op="GivenTensorInt16Fill", args={"shape": [2], "values": [-300, 7]}, inputs=[],
         ref="given_fill"),
    dict(id="given_bool_fill", op="GivenTensorBoolFill", args={"shape": [3], "values": [1, 0, 1]}, inputs=[],
         ref="given_fill"),
    dict(id="given_fill_dtype_int64", op="GivenTensorFill", args={"values": [5, 6], "dtype": 10}, inputs=[],
         ref="given_fill"),
    dict(id="given_bytes_fill", op="GivenTensorByteStringToUInt8Fill",
         args={"shape": [2, 2], "values": [b"\x00\x7f\x80\xff"]}, inputs=[], ref="given_fill"),

    # ------------------------------------------------------------ copies
    dict(id="copy", op="Copy", args={}, inputs=[randn(3, 2)], ref="identity"),
    dict(id="alias", op="Alias", args={}, inputs=[randint(0, 5, 4)], ref="identity"),
    dict(id="stop_gradient", op="StopGradient", args={}, inputs=[randn(2, 2)], ref="identity"),
    dict(id="ensure_cpu_output", op="EnsureCPUOutput", args={}, inputs=[randn(2)], ref="identity"),
    dict(id="copy_cpu_to_gpu", op="CopyCPUToGPU", args={}, inputs=[randn(2, 3)], ref="identity"),
    dict(id="copy_from_cpu_input", op="CopyFromCPUInput", args={}, inputs=[randn(4)], ref="identity"),
    dict(id="copy_gpu_to_cpu", op="CopyGPUToCPU", args={}, inputs=[randn(2, 3)], ref="identity"),
]
