"""caffe.proto message classes, wire- and text-compatible with BVLC Caffe's caffe.proto.

Field names, numbers, types and proto2 defaults follow PROTO_FACTS.md (BVLC caffe.proto;
``SolverParameter``, the solver.prototxt message, from BVLC caffe.proto itself)
plus the SSD fork's layer extensions (numbers 200-206: annotated_data_param,
multibox_loss_param, permute_param, prior_box_param, detection_output_param,
detection_evaluate_param, norm_param). Defaults matter: the converter reads them
(``bias_term`` true, ``group`` 1, pooling ``stride`` 1, LRN 5 / 1 / 0.75 / 1, ...).

Enums whose value names repeat across messages (``MAX``, ``SUM``, ``DEFAULT``) are nested
in their message, as in caffe.proto, so the text format accepts the same symbols.

``parse_text`` is the one entry point for prototxt text: the strict parser first, and
only when a field is unknown (another fork's extension) a tolerant re-parse that skips
unknown fields, so such files still load; syntax errors become ``NetParseError`` with
file:line:column.
"""
from __future__ import annotations

from google.protobuf import text_format

from placer.errors import NetParseError, excerpt
from placer.formats.schema import build_file

_ENGINE = {"DEFAULT": 0, "CAFFE": 1, "CUDNN": 2}
_POOL = {"MAX": 0, "AVE": 1, "STOCHASTIC": 2}


_MESSAGES = {
    "BlobShape": [("dim", 1, "int64", "repeated")],
    "BlobProto": [
        ("shape", 7, "BlobShape", "optional"),
        ("data", 5, "float", "repeated"),
        ("diff", 6, "float", "repeated"),
        ("double_data", 8, "double", "repeated"),
        ("double_diff", 9, "double", "repeated"),
        ("num", 1, "int32", "optional", 0),
        ("channels", 2, "int32", "optional", 0),
        ("height", 3, "int32", "optional", 0),
        ("width", 4, "int32", "optional", 0),
    ],
    "BlobProtoVector": [("blobs", 1, "BlobProto", "repeated")],
    "FillerParameter": [
        ("type", 1, "string", "optional", "constant"),
        ("value", 2, "float", "optional", 0),
        ("min", 3, "float", "optional", 0),
        ("max", 4, "float", "optional", 1),
        ("mean", 5, "float", "optional", 0),
        ("std", 6, "float", "optional", 1),
        ("sparse", 7, "int32", "optional", -1),
        ("variance_norm", 8, "FillerParameter.VarianceNorm", "optional", "FAN_IN"),
    ],
    "NetParameter": [
        ("name", 1, "string", "optional"),
        ("input", 3, "string", "repeated"),
        ("input_shape", 8, "BlobShape", "repeated"),
        ("input_dim", 4, "int32", "repeated"),
        ("force_backward", 5, "bool", "optional", False),
        ("state", 6, "NetState", "optional"),
        ("debug_info", 7, "bool", "optional", False),
        ("layer", 100, "LayerParameter", "repeated"),
        ("layers", 2, "V1LayerParameter", "repeated"),
    ],
    # BVLC caffe.proto's SolverParameter (what solver.prototxt holds), every field by number.
    "SolverParameter": [
        ("net", 24, "string", "optional"),
        ("net_param", 25, "NetParameter", "optional"),
        ("train_net", 1, "string", "optional"),
        ("test_net", 2, "string", "repeated"),
        ("train_net_param", 21, "NetParameter", "optional"),
        ("test_net_param", 22, "NetParameter", "repeated"),
        ("train_state", 26, "NetState", "optional"),
        ("test_state", 27, "NetState", "repeated"),
        ("test_iter", 3, "int32", "repeated"),
        ("test_interval", 4, "int32", "optional", 0),
        ("test_compute_loss", 19, "bool", "optional", False),
        ("test_initialization", 32, "bool", "optional", True),
        ("base_lr", 5, "float", "optional"),
        ("display", 6, "int32", "optional"),
        ("average_loss", 33, "int32", "optional", 1),
        ("max_iter", 7, "int32", "optional"),
        ("iter_size", 36, "int32", "optional", 1),
        ("lr_policy", 8, "string", "optional"),
        ("gamma", 9, "float", "optional"),
        ("power", 10, "float", "optional"),
        ("momentum", 11, "float", "optional"),
        ("weight_decay", 12, "float", "optional"),
        ("regularization_type", 29, "string", "optional", "L2"),
        ("stepsize", 13, "int32", "optional"),
        ("stepvalue", 34, "int32", "repeated"),
        ("clip_gradients", 35, "float", "optional", -1),
        ("snapshot", 14, "int32", "optional", 0),
        ("snapshot_prefix", 15, "string", "optional"),
        ("snapshot_diff", 16, "bool", "optional", False),
        ("snapshot_format", 37, "SolverParameter.SnapshotFormat", "optional", "BINARYPROTO"),
        ("solver_mode", 17, "SolverParameter.SolverMode", "optional", "GPU"),
        ("device_id", 18, "int32", "optional", 0),
        ("random_seed", 20, "int64", "optional", -1),
        ("type", 40, "string", "optional", "SGD"),
        ("delta", 31, "float", "optional", 1e-8),
        ("momentum2", 39, "float", "optional", 0.999),
        ("rms_decay", 38, "float", "optional", 0.99),
        ("debug_info", 23, "bool", "optional", False),
        ("snapshot_after_train", 28, "bool", "optional", True),
        ("solver_type", 30, "SolverParameter.SolverType", "optional", "SGD"),
        ("layer_wise_reduce", 41, "bool", "optional", True),
        ("weights", 42, "string", "repeated"),
    ],
    "NetState": [
        ("phase", 1, "Phase", "optional", "TEST"),
        ("level", 2, "int32", "optional", 0),
        ("stage", 3, "string", "repeated"),
    ],
    "NetStateRule": [
        ("phase", 1, "Phase", "optional"),
        ("min_level", 2, "int32", "optional"),
        ("max_level", 3, "int32", "optional"),
        ("stage", 4, "string", "repeated"),
        ("not_stage", 5, "string", "repeated"),
    ],
    "ParamSpec": [
        ("name", 1, "string", "optional"),
        ("share_mode", 2, "ParamSpec.DimCheckMode", "optional"),
        ("lr_mult", 3, "float", "optional", 1.0),
        ("decay_mult", 4, "float", "optional", 1.0),
    ],
    "LayerParameter": [
        ("name", 1, "string", "optional"),
        ("type", 2, "string", "optional"),
        ("bottom", 3, "string", "repeated"),
        ("top", 4, "string", "repeated"),
        ("phase", 10, "Phase", "optional"),
        ("loss_weight", 5, "float", "repeated"),
        ("param", 6, "ParamSpec", "repeated"),
        ("blobs", 7, "BlobProto", "repeated"),
        ("propagate_down", 11, "bool", "repeated"),
        ("include", 8, "NetStateRule", "repeated"),
        ("exclude", 9, "NetStateRule", "repeated"),
        ("transform_param", 100, "TransformationParameter", "optional"),
        ("loss_param", 101, "LossParameter", "optional"),
        ("accuracy_param", 102, "AccuracyParameter", "optional"),
        ("argmax_param", 103, "ArgMaxParameter", "optional"),
        ("batch_norm_param", 139, "BatchNormParameter", "optional"),
        ("bias_param", 141, "BiasParameter", "optional"),
        ("clip_param", 148, "ClipParameter", "optional"),
        ("concat_param", 104, "ConcatParameter", "optional"),
        ("contrastive_loss_param", 105, "ContrastiveLossParameter", "optional"),
        ("convolution_param", 106, "ConvolutionParameter", "optional"),
        ("crop_param", 144, "CropParameter", "optional"),
        ("data_param", 107, "DataParameter", "optional"),
        ("dropout_param", 108, "DropoutParameter", "optional"),
        ("dummy_data_param", 109, "DummyDataParameter", "optional"),
        ("eltwise_param", 110, "EltwiseParameter", "optional"),
        ("elu_param", 140, "ELUParameter", "optional"),
        ("embed_param", 137, "EmbedParameter", "optional"),
        ("exp_param", 111, "ExpParameter", "optional"),
        ("flatten_param", 135, "FlattenParameter", "optional"),
        ("hdf5_data_param", 112, "HDF5DataParameter", "optional"),
        ("hdf5_output_param", 113, "HDF5OutputParameter", "optional"),
        ("hinge_loss_param", 114, "HingeLossParameter", "optional"),
        ("image_data_param", 115, "ImageDataParameter", "optional"),
        ("infogain_loss_param", 116, "InfogainLossParameter", "optional"),
        ("inner_product_param", 117, "InnerProductParameter", "optional"),
        ("input_param", 143, "InputParameter", "optional"),
        ("log_param", 134, "LogParameter", "optional"),
        ("lrn_param", 118, "LRNParameter", "optional"),
        ("memory_data_param", 119, "MemoryDataParameter", "optional"),
        ("mvn_param", 120, "MVNParameter", "optional"),
        ("parameter_param", 145, "ParameterParameter", "optional"),
        ("pooling_param", 121, "PoolingParameter", "optional"),
        ("power_param", 122, "PowerParameter", "optional"),
        ("prelu_param", 131, "PReLUParameter", "optional"),
        ("python_param", 130, "PythonParameter", "optional"),
        ("recurrent_param", 146, "RecurrentParameter", "optional"),
        ("reduction_param", 136, "ReductionParameter", "optional"),
        ("relu_param", 123, "ReLUParameter", "optional"),
        ("reshape_param", 133, "ReshapeParameter", "optional"),
        ("scale_param", 142, "ScaleParameter", "optional"),
        ("sigmoid_param", 124, "SigmoidParameter", "optional"),
        ("softmax_param", 125, "SoftmaxParameter", "optional"),
        ("spp_param", 132, "SPPParameter", "optional"),
        ("slice_param", 126, "SliceParameter", "optional"),
        ("swish_param", 147, "SwishParameter", "optional"),
        ("tanh_param", 127, "TanHParameter", "optional"),
        ("threshold_param", 128, "ThresholdParameter", "optional"),
        ("tile_param", 138, "TileParameter", "optional"),
        ("window_data_param", 129, "WindowDataParameter", "optional"),
        # SSD fork extensions
        ("annotated_data_param", 200, "AnnotatedDataParameter", "optional"),
        ("multibox_loss_param", 201, "MultiBoxLossParameter", "optional"),
        ("permute_param", 202, "PermuteParameter", "optional"),
        ("prior_box_param", 203, "PriorBoxParameter", "optional"),
        ("detection_output_param", 204, "DetectionOutputParameter", "optional"),
        ("detection_evaluate_param", 205, "DetectionEvaluateParameter", "optional"),
        ("norm_param", 206, "NormalizeParameter", "optional"),
    ],
    "TransformationParameter": [
        ("scale", 1, "float", "optional", 1),
        ("mirror", 2, "bool", "optional", False),
        ("crop_size", 3, "uint32", "optional", 0),
        ("mean_file", 4, "string", "optional"),
        ("mean_value", 5, "float", "repeated"),
        ("force_color", 6, "bool", "optional", False),
        ("force_gray", 7, "bool", "optional", False),
    ],
    "LossParameter": [
        ("ignore_label", 1, "int32", "optional"),
        ("normalization", 3, "LossParameter.NormalizationMode", "optional", "VALID"),
        ("normalize", 2, "bool", "optional"),
    ],
    "AccuracyParameter": [
        ("top_k", 1, "uint32", "optional", 1),
        ("axis", 2, "int32", "optional", 1),
        ("ignore_label", 3, "int32", "optional"),
    ],
    "ArgMaxParameter": [
        ("out_max_val", 1, "bool", "optional", False),
        ("top_k", 2, "uint32", "optional", 1),
        ("axis", 3, "int32", "optional"),
    ],
    "BatchNormParameter": [
        ("use_global_stats", 1, "bool", "optional"),
        ("moving_average_fraction", 2, "float", "optional", 0.999),
        ("eps", 3, "float", "optional", 1e-5),
    ],
    "BiasParameter": [
        ("axis", 1, "int32", "optional", 1),
        ("num_axes", 2, "int32", "optional", 1),
        ("filler", 3, "FillerParameter", "optional"),
    ],
    "ClipParameter": [
        ("min", 1, "float", "optional"),
        ("max", 2, "float", "optional"),
    ],
    "ConcatParameter": [
        ("axis", 2, "int32", "optional", 1),
        ("concat_dim", 1, "uint32", "optional", 1),
    ],
    "ContrastiveLossParameter": [
        ("margin", 1, "float", "optional", 1.0),
        ("legacy_version", 2, "bool", "optional", False),
    ],
    "ConvolutionParameter": [
        ("num_output", 1, "uint32", "optional"),
        ("bias_term", 2, "bool", "optional", True),
        ("pad", 3, "uint32", "repeated"),
        ("kernel_size", 4, "uint32", "repeated"),
        ("stride", 6, "uint32", "repeated"),
        ("dilation", 18, "uint32", "repeated"),
        ("pad_h", 9, "uint32", "optional", 0),
        ("pad_w", 10, "uint32", "optional", 0),
        ("kernel_h", 11, "uint32", "optional"),
        ("kernel_w", 12, "uint32", "optional"),
        ("stride_h", 13, "uint32", "optional"),
        ("stride_w", 14, "uint32", "optional"),
        ("group", 5, "uint32", "optional", 1),
        ("weight_filler", 7, "FillerParameter", "optional"),
        ("bias_filler", 8, "FillerParameter", "optional"),
        ("engine", 15, "ConvolutionParameter.Engine", "optional", "DEFAULT"),
        ("axis", 16, "int32", "optional", 1),
        ("force_nd_im2col", 17, "bool", "optional", False),
    ],
    "CropParameter": [
        ("axis", 1, "int32", "optional", 2),
        ("offset", 2, "uint32", "repeated"),
    ],
    "DataParameter": [
        ("source", 1, "string", "optional"),
        ("batch_size", 4, "uint32", "optional"),
        ("rand_skip", 7, "uint32", "optional", 0),
        ("backend", 8, "DataParameter.DB", "optional", "LEVELDB"),
        ("scale", 2, "float", "optional", 1),
        ("mean_file", 3, "string", "optional"),
        ("crop_size", 5, "uint32", "optional", 0),
        ("mirror", 6, "bool", "optional", False),
        ("force_encoded_color", 9, "bool", "optional", False),
        ("prefetch", 10, "uint32", "optional", 4),
    ],
    "DropoutParameter": [("dropout_ratio", 1, "float", "optional", 0.5)],
    "DummyDataParameter": [
        ("data_filler", 1, "FillerParameter", "repeated"),
        ("shape", 6, "BlobShape", "repeated"),
        ("num", 2, "uint32", "repeated"),
        ("channels", 3, "uint32", "repeated"),
        ("height", 4, "uint32", "repeated"),
        ("width", 5, "uint32", "repeated"),
    ],
    "EltwiseParameter": [
        ("operation", 1, "EltwiseParameter.EltwiseOp", "optional", "SUM"),
        ("coeff", 2, "float", "repeated"),
        ("stable_prod_grad", 3, "bool", "optional", True),
    ],
    "ELUParameter": [("alpha", 1, "float", "optional", 1)],
    "EmbedParameter": [
        ("num_output", 1, "uint32", "optional"),
        ("input_dim", 2, "uint32", "optional"),
        ("bias_term", 3, "bool", "optional", True),
        ("weight_filler", 4, "FillerParameter", "optional"),
        ("bias_filler", 5, "FillerParameter", "optional"),
    ],
    "ExpParameter": [
        ("base", 1, "float", "optional", -1.0),
        ("scale", 2, "float", "optional", 1.0),
        ("shift", 3, "float", "optional", 0.0),
    ],
    "FlattenParameter": [
        ("axis", 1, "int32", "optional", 1),
        ("end_axis", 2, "int32", "optional", -1),
    ],
    "HDF5DataParameter": [
        ("source", 1, "string", "optional"),
        ("batch_size", 2, "uint32", "optional"),
        ("shuffle", 3, "bool", "optional", False),
    ],
    "HDF5OutputParameter": [("file_name", 1, "string", "optional")],
    "HingeLossParameter": [("norm", 1, "HingeLossParameter.Norm", "optional", "L1")],
    "ImageDataParameter": [
        ("source", 1, "string", "optional"),
        ("batch_size", 4, "uint32", "optional", 1),
        ("rand_skip", 7, "uint32", "optional", 0),
        ("shuffle", 8, "bool", "optional", False),
        ("new_height", 9, "uint32", "optional", 0),
        ("new_width", 10, "uint32", "optional", 0),
        ("is_color", 11, "bool", "optional", True),
        ("scale", 2, "float", "optional", 1),
        ("mean_file", 3, "string", "optional"),
        ("crop_size", 5, "uint32", "optional", 0),
        ("mirror", 6, "bool", "optional", False),
        ("root_folder", 12, "string", "optional", ""),
    ],
    "InfogainLossParameter": [
        ("source", 1, "string", "optional"),
        ("axis", 2, "int32", "optional", 1),
    ],
    "InnerProductParameter": [
        ("num_output", 1, "uint32", "optional"),
        ("bias_term", 2, "bool", "optional", True),
        ("weight_filler", 3, "FillerParameter", "optional"),
        ("bias_filler", 4, "FillerParameter", "optional"),
        ("axis", 5, "int32", "optional", 1),
        ("transpose", 6, "bool", "optional", False),
    ],
    "InputParameter": [("shape", 1, "BlobShape", "repeated")],
    "LogParameter": [
        ("base", 1, "float", "optional", -1.0),
        ("scale", 2, "float", "optional", 1.0),
        ("shift", 3, "float", "optional", 0.0),
    ],
    "LRNParameter": [
        ("local_size", 1, "uint32", "optional", 5),
        ("alpha", 2, "float", "optional", 1.0),
        ("beta", 3, "float", "optional", 0.75),
        ("norm_region", 4, "LRNParameter.NormRegion", "optional", "ACROSS_CHANNELS"),
        ("k", 5, "float", "optional", 1.0),
        ("engine", 6, "LRNParameter.Engine", "optional", "DEFAULT"),
    ],
    "MemoryDataParameter": [
        ("batch_size", 1, "uint32", "optional"),
        ("channels", 2, "uint32", "optional"),
        ("height", 3, "uint32", "optional"),
        ("width", 4, "uint32", "optional"),
    ],
    "MVNParameter": [
        ("normalize_variance", 1, "bool", "optional", True),
        ("across_channels", 2, "bool", "optional", False),
        ("eps", 3, "float", "optional", 1e-9),
    ],
    "ParameterParameter": [("shape", 1, "BlobShape", "optional")],
    "PoolingParameter": [
        ("pool", 1, "PoolingParameter.PoolMethod", "optional", "MAX"),
        ("pad", 4, "uint32", "optional", 0),
        ("pad_h", 9, "uint32", "optional", 0),
        ("pad_w", 10, "uint32", "optional", 0),
        ("kernel_size", 2, "uint32", "optional"),
        ("kernel_h", 5, "uint32", "optional"),
        ("kernel_w", 6, "uint32", "optional"),
        ("stride", 3, "uint32", "optional", 1),
        ("stride_h", 7, "uint32", "optional"),
        ("stride_w", 8, "uint32", "optional"),
        ("engine", 11, "PoolingParameter.Engine", "optional", "DEFAULT"),
        ("global_pooling", 12, "bool", "optional", False),
        ("round_mode", 13, "PoolingParameter.RoundMode", "optional", "CEIL"),
    ],
    "PowerParameter": [
        ("power", 1, "float", "optional", 1.0),
        ("scale", 2, "float", "optional", 1.0),
        ("shift", 3, "float", "optional", 0.0),
    ],
    "PReLUParameter": [
        ("filler", 1, "FillerParameter", "optional"),
        ("channel_shared", 2, "bool", "optional", False),
    ],
    "PythonParameter": [
        ("module", 1, "string", "optional"),
        ("layer", 2, "string", "optional"),
        ("param_str", 3, "string", "optional", ""),
        ("share_in_parallel", 4, "bool", "optional", False),
    ],
    "RecurrentParameter": [
        ("num_output", 1, "uint32", "optional", 0),
        ("weight_filler", 2, "FillerParameter", "optional"),
        ("bias_filler", 3, "FillerParameter", "optional"),
        ("debug_info", 4, "bool", "optional", False),
        ("expose_hidden", 5, "bool", "optional", False),
    ],
    "ReductionParameter": [
        ("operation", 1, "ReductionParameter.ReductionOp", "optional", "SUM"),
        ("axis", 2, "int32", "optional", 0),
        ("coeff", 3, "float", "optional", 1.0),
    ],
    "ReLUParameter": [
        ("negative_slope", 1, "float", "optional", 0),
        ("engine", 2, "ReLUParameter.Engine", "optional", "DEFAULT"),
    ],
    "ReshapeParameter": [
        ("shape", 1, "BlobShape", "optional"),
        ("axis", 2, "int32", "optional", 0),
        ("num_axes", 3, "int32", "optional", -1),
    ],
    "ScaleParameter": [
        ("axis", 1, "int32", "optional", 1),
        ("num_axes", 2, "int32", "optional", 1),
        ("filler", 3, "FillerParameter", "optional"),
        ("bias_term", 4, "bool", "optional", False),
        ("bias_filler", 5, "FillerParameter", "optional"),
    ],
    "SigmoidParameter": [("engine", 1, "SigmoidParameter.Engine", "optional", "DEFAULT")],
    "SoftmaxParameter": [
        ("engine", 1, "SoftmaxParameter.Engine", "optional", "DEFAULT"),
        ("axis", 2, "int32", "optional", 1),
    ],
    "SliceParameter": [
        ("axis", 3, "int32", "optional", 1),
        ("slice_point", 2, "uint32", "repeated"),
        ("slice_dim", 1, "uint32", "optional", 1),
    ],
    "SPPParameter": [
        ("pyramid_height", 1, "uint32", "optional"),
        ("pool", 2, "SPPParameter.PoolMethod", "optional", "MAX"),
        ("engine", 6, "SPPParameter.Engine", "optional", "DEFAULT"),
    ],
    "SwishParameter": [("beta", 1, "float", "optional", 1)],
    "TanHParameter": [("engine", 1, "TanHParameter.Engine", "optional", "DEFAULT")],
    "ThresholdParameter": [("threshold", 1, "float", "optional", 0)],
    "TileParameter": [
        ("axis", 1, "int32", "optional", 1),
        ("tiles", 2, "int32", "optional"),
    ],
    "WindowDataParameter": [
        ("source", 1, "string", "optional"),
        ("scale", 2, "float", "optional", 1),
        ("mean_file", 3, "string", "optional"),
        ("batch_size", 4, "uint32", "optional"),
        ("crop_size", 5, "uint32", "optional", 0),
        ("mirror", 6, "bool", "optional", False),
        ("fg_threshold", 7, "float", "optional", 0.5),
        ("bg_threshold", 8, "float", "optional", 0.5),
        ("fg_fraction", 9, "float", "optional", 0.25),
        ("context_pad", 10, "uint32", "optional", 0),
        ("crop_mode", 11, "string", "optional", "warp"),
        ("cache_images", 12, "bool", "optional", False),
        ("root_folder", 13, "string", "optional", ""),
    ],
    # SSD fork messages (weiliu89-derived caffe.proto)
    "Sampler": [
        ("min_scale", 1, "float", "optional", 1.0),
        ("max_scale", 2, "float", "optional", 1.0),
        ("min_aspect_ratio", 3, "float", "optional", 1.0),
        ("max_aspect_ratio", 4, "float", "optional", 1.0),
    ],
    "SampleConstraint": [
        ("min_jaccard_overlap", 1, "float", "optional"),
        ("max_jaccard_overlap", 2, "float", "optional"),
        ("min_sample_coverage", 3, "float", "optional"),
        ("max_sample_coverage", 4, "float", "optional"),
        ("min_object_coverage", 5, "float", "optional"),
        ("max_object_coverage", 6, "float", "optional"),
    ],
    "BatchSampler": [
        ("use_original_image", 1, "bool", "optional", True),
        ("sampler", 2, "Sampler", "optional"),
        ("sample_constraint", 3, "SampleConstraint", "optional"),
        ("max_sample", 4, "uint32", "optional"),
        ("max_trials", 5, "uint32", "optional", 100),
    ],
    "AnnotatedDataParameter": [
        ("batch_sampler", 1, "BatchSampler", "repeated"),
        ("label_map_file", 2, "string", "optional"),
        ("anno_type", 3, "AnnotatedDataParameter.AnnotationType", "optional"),
    ],
    "NonMaximumSuppressionParameter": [
        ("nms_threshold", 1, "float", "optional", 0.3),
        ("top_k", 2, "int32", "optional"),
        ("eta", 3, "float", "optional", 1.0),
    ],
    "SaveOutputParameter": [
        ("output_directory", 1, "string", "optional"),
        ("output_name_prefix", 2, "string", "optional"),
        ("output_format", 3, "string", "optional"),
        ("label_map_file", 4, "string", "optional"),
        ("name_size_file", 5, "string", "optional"),
        ("num_test_image", 6, "uint32", "optional"),
    ],
    "MultiBoxLossParameter": [
        ("loc_loss_type", 1, "MultiBoxLossParameter.LocLossType", "optional", "SMOOTH_L1"),
        ("conf_loss_type", 2, "MultiBoxLossParameter.ConfLossType", "optional", "SOFTMAX"),
        ("loc_weight", 3, "float", "optional", 1.0),
        ("num_classes", 4, "uint32", "optional"),
        ("share_location", 5, "bool", "optional", True),
        ("match_type", 6, "MultiBoxLossParameter.MatchType", "optional", "PER_PREDICTION"),
        ("overlap_threshold", 7, "float", "optional", 0.5),
        ("use_prior_for_matching", 8, "bool", "optional", True),
        ("background_label_id", 9, "uint32", "optional", 0),
        ("use_difficult_gt", 10, "bool", "optional", True),
        ("do_neg_mining", 11, "bool", "optional"),
        ("neg_pos_ratio", 12, "float", "optional", 3.0),
        ("neg_overlap", 13, "float", "optional", 0.5),
        ("code_type", 14, "PriorBoxParameter.CodeType", "optional", "CORNER"),
        ("encode_variance_in_target", 16, "bool", "optional", False),
        ("map_object_to_agnostic", 17, "bool", "optional", False),
        ("ignore_cross_boundary_bbox", 18, "bool", "optional", False),
        ("bp_inside", 19, "bool", "optional", False),
        ("mining_type", 20, "MultiBoxLossParameter.MiningType", "optional", "MAX_NEGATIVE"),
        ("nms_param", 21, "NonMaximumSuppressionParameter", "optional"),
        ("sample_size", 22, "int32", "optional", 64),
        ("use_prior_for_nms", 23, "bool", "optional", False),
    ],
    "PermuteParameter": [("order", 1, "uint32", "repeated")],
    "PriorBoxParameter": [
        ("min_size", 1, "float", "repeated"),
        ("max_size", 2, "float", "repeated"),
        ("aspect_ratio", 3, "float", "repeated"),
        ("flip", 4, "bool", "optional", True),
        ("clip", 5, "bool", "optional", False),
        ("variance", 6, "float", "repeated"),
        ("img_size", 7, "uint32", "optional"),
        ("img_h", 8, "uint32", "optional"),
        ("img_w", 9, "uint32", "optional"),
        ("step", 10, "float", "optional"),
        ("step_h", 11, "float", "optional"),
        ("step_w", 12, "float", "optional"),
        ("offset", 13, "float", "optional", 0.5),
    ],
    "DetectionOutputParameter": [
        ("num_classes", 1, "uint32", "optional"),
        ("share_location", 2, "bool", "optional", True),
        ("background_label_id", 3, "int32", "optional", 0),
        ("nms_param", 4, "NonMaximumSuppressionParameter", "optional"),
        ("save_output_param", 5, "SaveOutputParameter", "optional"),
        ("code_type", 6, "PriorBoxParameter.CodeType", "optional", "CORNER"),
        ("variance_encoded_in_target", 8, "bool", "optional", False),
        ("keep_top_k", 7, "int32", "optional", -1),
        ("confidence_threshold", 9, "float", "optional"),
        ("visualize", 10, "bool", "optional", False),
        ("visualize_threshold", 11, "float", "optional"),
        ("save_file", 12, "string", "optional"),
    ],
    "DetectionEvaluateParameter": [
        ("num_classes", 1, "uint32", "optional"),
        ("background_label_id", 2, "uint32", "optional", 0),
        ("overlap_threshold", 3, "float", "optional", 0.5),
        ("evaluate_difficult_gt", 4, "bool", "optional", True),
        ("name_size_file", 5, "string", "optional"),
    ],
    "NormalizeParameter": [
        ("across_spatial", 1, "bool", "optional", True),
        ("scale_filler", 2, "FillerParameter", "optional"),
        ("channel_shared", 3, "bool", "optional", True),
        ("eps", 4, "float", "optional", 1e-10),
    ],
    # The deprecated generations: V1 (`layers { type: CONVOLUTION }`) and V0 (nested `layer {}`)
    "V1LayerParameter": [
        ("bottom", 2, "string", "repeated"),
        ("top", 3, "string", "repeated"),
        ("name", 4, "string", "optional"),
        ("include", 32, "NetStateRule", "repeated"),
        ("exclude", 33, "NetStateRule", "repeated"),
        ("type", 5, "V1LayerParameter.LayerType", "optional"),
        ("blobs", 6, "BlobProto", "repeated"),
        ("param", 1001, "string", "repeated"),
        ("blob_share_mode", 1002, "V1LayerParameter.DimCheckMode", "repeated"),
        ("blobs_lr", 7, "float", "repeated"),
        ("weight_decay", 8, "float", "repeated"),
        ("loss_weight", 35, "float", "repeated"),
        ("accuracy_param", 27, "AccuracyParameter", "optional"),
        ("argmax_param", 23, "ArgMaxParameter", "optional"),
        ("concat_param", 9, "ConcatParameter", "optional"),
        ("contrastive_loss_param", 40, "ContrastiveLossParameter", "optional"),
        ("convolution_param", 10, "ConvolutionParameter", "optional"),
        ("data_param", 11, "DataParameter", "optional"),
        ("dropout_param", 12, "DropoutParameter", "optional"),
        ("dummy_data_param", 26, "DummyDataParameter", "optional"),
        ("eltwise_param", 24, "EltwiseParameter", "optional"),
        ("exp_param", 41, "ExpParameter", "optional"),
        ("hdf5_data_param", 13, "HDF5DataParameter", "optional"),
        ("hdf5_output_param", 14, "HDF5OutputParameter", "optional"),
        ("hinge_loss_param", 29, "HingeLossParameter", "optional"),
        ("image_data_param", 15, "ImageDataParameter", "optional"),
        ("infogain_loss_param", 16, "InfogainLossParameter", "optional"),
        ("inner_product_param", 17, "InnerProductParameter", "optional"),
        ("lrn_param", 18, "LRNParameter", "optional"),
        ("memory_data_param", 22, "MemoryDataParameter", "optional"),
        ("mvn_param", 34, "MVNParameter", "optional"),
        ("pooling_param", 19, "PoolingParameter", "optional"),
        ("power_param", 21, "PowerParameter", "optional"),
        ("relu_param", 30, "ReLUParameter", "optional"),
        ("sigmoid_param", 38, "SigmoidParameter", "optional"),
        ("softmax_param", 39, "SoftmaxParameter", "optional"),
        ("slice_param", 31, "SliceParameter", "optional"),
        ("tanh_param", 37, "TanHParameter", "optional"),
        ("threshold_param", 25, "ThresholdParameter", "optional"),
        ("window_data_param", 20, "WindowDataParameter", "optional"),
        ("transform_param", 36, "TransformationParameter", "optional"),
        ("loss_param", 42, "LossParameter", "optional"),
        ("layer", 1, "V0LayerParameter", "optional"),
    ],
    "V0LayerParameter": [
        ("name", 1, "string", "optional"),
        ("type", 2, "string", "optional"),
        ("num_output", 3, "uint32", "optional"),
        ("biasterm", 4, "bool", "optional", True),
        ("weight_filler", 5, "FillerParameter", "optional"),
        ("bias_filler", 6, "FillerParameter", "optional"),
        ("pad", 7, "uint32", "optional", 0),
        ("kernelsize", 8, "uint32", "optional"),
        ("group", 9, "uint32", "optional", 1),
        ("stride", 10, "uint32", "optional", 1),
        ("pool", 11, "V0LayerParameter.PoolMethod", "optional", "MAX"),
        ("dropout_ratio", 12, "float", "optional", 0.5),
        ("local_size", 13, "uint32", "optional", 5),
        ("alpha", 14, "float", "optional", 1.0),
        ("beta", 15, "float", "optional", 0.75),
        ("k", 22, "float", "optional", 1.0),
        ("source", 16, "string", "optional"),
        ("scale", 17, "float", "optional", 1),
        ("meanfile", 18, "string", "optional"),
        ("batchsize", 19, "uint32", "optional"),
        ("cropsize", 20, "uint32", "optional", 0),
        ("mirror", 21, "bool", "optional", False),
        ("blobs", 50, "BlobProto", "repeated"),
        ("blobs_lr", 51, "float", "repeated"),
        ("weight_decay", 52, "float", "repeated"),
        ("rand_skip", 53, "uint32", "optional", 0),
        ("det_fg_threshold", 54, "float", "optional", 0.5),
        ("det_bg_threshold", 55, "float", "optional", 0.5),
        ("det_fg_fraction", 56, "float", "optional", 0.25),
        ("det_context_pad", 58, "uint32", "optional", 0),
        ("det_crop_mode", 59, "string", "optional", "warp"),
        ("new_num", 60, "int32", "optional", 0),
        ("new_channels", 61, "int32", "optional", 0),
        ("new_height", 62, "int32", "optional", 0),
        ("new_width", 63, "int32", "optional", 0),
        ("shuffle_images", 64, "bool", "optional", False),
        ("concat_dim", 65, "uint32", "optional", 1),
        ("hdf5_output_param", 1001, "HDF5OutputParameter", "optional"),
    ],
}

# V1 LayerType enum value -> the V2 type string Caffe's upgrader writes.
V1_TYPE_NAMES = {
    "NONE": "", "ABSVAL": "AbsVal", "ACCURACY": "Accuracy", "ARGMAX": "ArgMax", "BNLL": "BNLL",
    "CONCAT": "Concat", "CONTRASTIVE_LOSS": "ContrastiveLoss", "CONVOLUTION": "Convolution",
    "DATA": "Data", "DECONVOLUTION": "Deconvolution", "DROPOUT": "Dropout",
    "DUMMY_DATA": "DummyData", "EUCLIDEAN_LOSS": "EuclideanLoss", "ELTWISE": "Eltwise",
    "EXP": "Exp", "FLATTEN": "Flatten", "HDF5_DATA": "HDF5Data", "HDF5_OUTPUT": "HDF5Output",
    "HINGE_LOSS": "HingeLoss", "IM2COL": "Im2col", "IMAGE_DATA": "ImageData",
    "INFOGAIN_LOSS": "InfogainLoss", "INNER_PRODUCT": "InnerProduct", "LRN": "LRN",
    "MEMORY_DATA": "MemoryData", "MULTINOMIAL_LOGISTIC_LOSS": "MultinomialLogisticLoss",
    "MVN": "MVN", "POOLING": "Pooling", "POWER": "Power", "RELU": "ReLU", "SIGMOID": "Sigmoid",
    "SIGMOID_CROSS_ENTROPY_LOSS": "SigmoidCrossEntropyLoss", "SILENCE": "Silence",
    "SOFTMAX": "Softmax", "SOFTMAX_LOSS": "SoftmaxWithLoss", "SPLIT": "Split", "SLICE": "Slice",
    "TANH": "TanH", "WINDOW_DATA": "WindowData", "THRESHOLD": "Threshold",
}
_V1_NUMBERS = {
    "NONE": 0, "ACCURACY": 1, "BNLL": 2, "CONCAT": 3, "CONVOLUTION": 4, "DATA": 5, "DROPOUT": 6,
    "EUCLIDEAN_LOSS": 7, "FLATTEN": 8, "HDF5_DATA": 9, "HDF5_OUTPUT": 10, "IM2COL": 11,
    "IMAGE_DATA": 12, "INFOGAIN_LOSS": 13, "INNER_PRODUCT": 14, "LRN": 15,
    "MULTINOMIAL_LOGISTIC_LOSS": 16, "POOLING": 17, "RELU": 18, "SIGMOID": 19, "SOFTMAX": 20,
    "SOFTMAX_LOSS": 21, "SPLIT": 22, "TANH": 23, "WINDOW_DATA": 24, "ELTWISE": 25, "POWER": 26,
    "SIGMOID_CROSS_ENTROPY_LOSS": 27, "HINGE_LOSS": 28, "MEMORY_DATA": 29, "ARGMAX": 30,
    "THRESHOLD": 31, "DUMMY_DATA": 32, "SLICE": 33, "MVN": 34, "ABSVAL": 35, "SILENCE": 36,
    "CONTRASTIVE_LOSS": 37, "EXP": 38, "DECONVOLUTION": 39,
}

_ENUMS = {
    "Phase": {"TRAIN": 0, "TEST": 1},
    "FillerParameter.VarianceNorm": {"FAN_IN": 0, "FAN_OUT": 1, "AVERAGE": 2},
    "ParamSpec.DimCheckMode": {"STRICT": 0, "PERMISSIVE": 1},
    "SolverParameter.SnapshotFormat": {"HDF5": 0, "BINARYPROTO": 1},
    "SolverParameter.SolverMode": {"CPU": 0, "GPU": 1},
    "SolverParameter.SolverType": {"SGD": 0, "NESTEROV": 1, "ADAGRAD": 2, "RMSPROP": 3,
                                   "ADADELTA": 4, "ADAM": 5},
    "V1LayerParameter.DimCheckMode": {"STRICT": 0, "PERMISSIVE": 1},
    "V1LayerParameter.LayerType": _V1_NUMBERS,
    "V0LayerParameter.PoolMethod": _POOL,
    "LossParameter.NormalizationMode": {"FULL": 0, "VALID": 1, "BATCH_SIZE": 2, "NONE": 3},
    "ConvolutionParameter.Engine": _ENGINE,
    "DataParameter.DB": {"LEVELDB": 0, "LMDB": 1},
    "EltwiseParameter.EltwiseOp": {"PROD": 0, "SUM": 1, "MAX": 2},
    "HingeLossParameter.Norm": {"L1": 1, "L2": 2},
    "LRNParameter.NormRegion": {"ACROSS_CHANNELS": 0, "WITHIN_CHANNEL": 1},
    "LRNParameter.Engine": _ENGINE,
    "PoolingParameter.PoolMethod": _POOL,
    "PoolingParameter.Engine": _ENGINE,
    "PoolingParameter.RoundMode": {"CEIL": 0, "FLOOR": 1},
    "ReductionParameter.ReductionOp": {"SUM": 1, "ASUM": 2, "SUMSQ": 3, "MEAN": 4},
    "ReLUParameter.Engine": _ENGINE,
    "SigmoidParameter.Engine": _ENGINE,
    "SoftmaxParameter.Engine": _ENGINE,
    "SPPParameter.PoolMethod": _POOL,
    "SPPParameter.Engine": _ENGINE,
    "TanHParameter.Engine": _ENGINE,
    "AnnotatedDataParameter.AnnotationType": {"BBOX": 0},
    "MultiBoxLossParameter.LocLossType": {"L2": 0, "SMOOTH_L1": 1},
    "MultiBoxLossParameter.ConfLossType": {"SOFTMAX": 0, "LOGISTIC": 1},
    "MultiBoxLossParameter.MatchType": {"BIPARTITE": 0, "PER_PREDICTION": 1},
    "MultiBoxLossParameter.MiningType": {"NONE": 0, "MAX_NEGATIVE": 1, "HARD_EXAMPLE": 2},
    "PriorBoxParameter.CodeType": {"CORNER": 1, "CENTER_SIZE": 2, "CORNER_SIZE": 3},
}

_PACKED = frozenset({("BlobShape", "dim"), ("BlobProto", "data"), ("BlobProto", "diff"),
                     ("BlobProto", "double_data"), ("BlobProto", "double_diff")})

_CLASSES = build_file("placer/caffe.proto", "caffe", _MESSAGES, _ENUMS, _PACKED)

NetParameter = _CLASSES["NetParameter"]
LayerParameter = _CLASSES["LayerParameter"]
V1LayerParameter = _CLASSES["V1LayerParameter"]
V0LayerParameter = _CLASSES["V0LayerParameter"]
BlobProto = _CLASSES["BlobProto"]
BlobShape = _CLASSES["BlobShape"]
NetState = _CLASSES["NetState"]
NetStateRule = _CLASSES["NetStateRule"]
ParamSpec = _CLASSES["ParamSpec"]
FillerParameter = _CLASSES["FillerParameter"]
SolverParameter = _CLASSES["SolverParameter"]

TRAIN = 0
TEST = 1


def parse_text(text: str, path: str = "<text>") -> tuple[object, list[str]]:
    """Parse prototxt text into a NetParameter; returns ``(message, notes)``.

    The strict parse runs first. If it fails only because a field is unknown (a field of
    another Caffe fork), the text is parsed again skipping unknown fields, and ``notes``
    says which field was met first. Any other syntax error is a ``NetParseError`` with
    the file, line and column the protobuf parser reports.
    """
    net = NetParameter()
    try:
        text_format.Parse(text, net)
        return net, []
    except text_format.ParseError as strict_error:
        if "no field named" not in str(strict_error) and "has no value named" not in str(strict_error):
            raise _parse_error(path, strict_error) from None
        first = strict_error
    net = NetParameter()
    try:
        text_format.Parse(text, net, allow_unknown_field=True)
    except text_format.ParseError as e:
        raise _parse_error(path, e if "no field named" not in str(e) else first) from None
    note = f"{path}: fields unknown to caffe.proto were skipped, first at {_where(first)}"
    return net, [note]


def _where(error: text_format.ParseError) -> str:
    line, column = error.GetLine(), error.GetColumn()
    message = excerpt(str(error).split(" : ", 1)[-1], 120)
    return f"line {line}:{column} ({message})" if line else message


def _parse_error(path: str, error: text_format.ParseError) -> NetParseError:
    message = excerpt(str(error).split(" : ", 1)[-1], 120)  # protobuf quotes the token: any length
    return NetParseError(path, f"not a valid Caffe prototxt: {message}",
                         line=error.GetLine(), column=error.GetColumn(),
                         hint="fix the text at that position (protobuf text format)")
