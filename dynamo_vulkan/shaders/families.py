"""The defines each kernel family (shaders/<family>.comp) accepts.

A lowering rule specialises a family by #defines at the head of its source
(runtime/shaders.kernel_source). Each family declares here the names it takes: the
`required` ones its GLSL uses without a default, and the `optional` ones it tests with
#ifdef/#if, gives a default, or reads only through an include. A function-like define
("LOAD(w)") is declared by its name. `labels` are names a rule sets to say which variant
it chose where the kernel's default branch serves it ("AVG" beside "MAX"): accepted, and
not looked for in the source. VARIANT (the dispatch's name) is accepted by every family.

kernel_source calls check() first, so a misspelled or missing define is an error that
names the family, the define and what the family accepts, instead of a kernel that
compiles without it (an #ifdef never taken) or a glslc error far from its cause.
tests/test_shader_defines.py holds the declarations to the sources."""
from __future__ import annotations

from dataclasses import dataclass

# the QTYPE_<name> define that selects a GGUF block type in gguf_blocks.glsl
GGUF_QTYPES = frozenset(f"QTYPE_{t}" for t in ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                                               "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"))
ALWAYS = frozenset({"VARIANT"})


class ShaderDefineError(ValueError):
    """A kernel family was given a define it does not declare, or lacks a required one."""


@dataclass(frozen=True)
class Family:
    required: frozenset = frozenset()
    optional: frozenset = frozenset()
    labels: frozenset = frozenset()

    @property
    def accepted(self) -> frozenset:
        return self.required | self.optional | self.labels | ALWAYS


def _f(required: str = "", optional: str = "", labels: str = "", extra=frozenset()) -> Family:
    return Family(frozenset(required.split()), frozenset(optional.split()) | extra,
                  frozenset(labels.split()))


# shaders/special.glsl's functions, each compiled in by its NEED_<name>
SPECIAL = ("NEED_DIGAMMA NEED_ERFINV NEED_I0 NEED_IGAMMA NEED_LGAMMA NEED_LSE NEED_NEXTAFTER "
           "NEED_SIGNBIT NEED_RANDOM_BITS NEED_TRIGAMMA NEED_ZETA")
_GGUF_MATVEC_PROLOGUE = "NORM X_LAZY POST_NORM POST_RES PN_COUNT PN_GROUP PN_RAW PN_RES PN_W RESIDUAL RES_BINDING"

FAMILIES: dict[str, Family] = {
    "accumulate": _f(),
    "argreduce": _f("INNER_INDEX LOAD OUTER_INDEX SPEC_DECLS STORE VAL_T",
                    "CHUNK SPLITS IS_FLOAT LARGEST PAIRS WANT_VALUES", "SMALLEST"),
    "attention_tiled": _f("BK BQ D DV RPT TPRG", "KV_APART K_VEC4 Q_VEC4 V_VEC4"),
    "attention": _f("", "AR COUNTER_BINDING CPU_LANES D DPT DV DVL DVLP IDX_BINDING IDX_OFF KPP "
                        "K_NEW K_RPH K_W PARTS PENDING Q_LAZY Q_RPH Q_W "
                        "NIBBLES PLANES PLANES_BINDING RANGES_BINDING SCRATCH_BINDING SPLITS TPK VPK VW V_NEW V_RPH V_W WG"),
    "cdist": _f("", "PDIST P_INF P_ONE P_TWO P_ZERO", "P_ANY"),
    "conv": _f("", "HAS_BIAS TRANSPOSED"),
    "coopmat_pack": _f("", "ALONG_ROWS BF16_IN_F16 CM_BF16 GGUF LZ_OCT NORM SCALED SPLIT3 SROWS X_LAZY", "CM_F16",
                        extra=GGUF_QTYPES),
    "cumext": _f("LOAD ROW_INDEX SPEC_DECLS STORE TAKES VAL_T"),
    "elementwise": _f("BUFFER_DECLS INDEX_CODE OUT_STORE SPEC_DECLS", SPECIAL),
    "embedding_bag": _f("", "HAS_PSW MAX MEAN", "SUM"),
    "gather": _f(),
    "gguf_embed": _f("", "", extra=GGUF_QTYPES),
    "gguf_dequant": _f("", "", extra=GGUF_QTYPES),
    "gguf_matmul": _f("", "CPU_LANES CL_MR CL_NC CL_WG", extra=GGUF_QTYPES),
    "gguf_matvec": _f("", "CPL FULL_STEPS MAXWG MROWS NR TPR UNROLL X_VEC4 " + _GGUF_MATVEC_PROLOGUE,
                      extra=GGUF_QTYPES),
    "gguf_matvec_idot": _f("", "MAXSG NR PLANES RESIDUAL UNROLL", extra=GGUF_QTYPES),
    "gguf_xplanes": _f("", "MAXWG NIBBLES NORM PLANES X_LAZY X_VEC4"),
    "grid_sample": _f("", "ALIGN BICUBIC BORDER DIM3 NEAREST REFLECTION", "BILINEAR ZEROS"),
    "histogram": _f("SPEC_DECLS X_INDEX", "LOCAL SEARCH WEIGHTED", "LINEAR"),
    "histogramdd": _f("", "SEARCH WEIGHTED", "LOCAL"),
    "mask_ranges": _f("", "M_VEC4"),
    "matmul": _f("", "A_ALONG_K A_VEC4 B_ALONG_K B_VEC4 BK BM BN CPU_LANES CL_MR CL_NC CL_WG "
                     "HAS_BIAS OUT_VEC4 TM TN"),
    "matmul_coopmat": _f("", "A_ALONG_K A_PACKED A_VEC4 B_ALONG_K B_PACKED B_VEC4 BF16_IN_F16 BK BM BN "
                             "ACC16 B_GGUF CM_BF16 CM_F16 CM_K CM_M CM_N FOLD HAS_BIAS PREFETCH SCALED SG_M SG_N SPLIT3 "
                             "SUBGROUP", extra=GGUF_QTYPES),
    "matvec": _f("", "A_VEC4 B_VEC4 COLS COUNT_BINDING CQ HAS_BIAS KT MC MROWS PART_BINDING "
                     "PART_VEC4 SPLIT_K UNROLL"),
    "pool": _f("", "ADAPTIVE MAX", "AVG"),
    "reduce": _f("ACC_T COMBINE FINAL INIT INNER_INDEX LOAD OUTER_INDEX SPEC_DECLS STORE "
                 "SUBGROUP_COMBINE", "CHECK_BINDING COLUMNS COUNT_BINDING CQ HAS_AUX KT PART_BINDING PER_LANE SPLITS "
                 "X_LAZY XL_K"),
    "rowwise": _f("BUFFER_DECLS ROW_INDEX SPEC_DECLS",
                  "HAS_BIAS HAS_RESIDUAL HAS_WEIGHT LAYER_NORM_BACKWARD LOG_SOFTMAX RMS_NORM SOFTMAX",
                  "LAYER_NORM"),
    "scan": _f("ACC_T COMBINE INIT LOAD ROW_INDEX SPEC_DECLS STORE", "CHECK_BINDING " + SPECIAL),
    "search": _f("LOAD VAL_T", "IS_FLOAT RIGHT SORTER"),
    "segment": _f("COMBINE", "MEAN OFFSETS"),
    "sort": _f("LOAD ROW_INDEX SPEC_DECLS STORE VAL_T", "DESCENDING IS_FLOAT NAN_MEDIAN"),
    "step_feed": _f(),
    "upload": _f("", "REGROUP"),
}


def define_name(key: str) -> str:
    """The name of a define key: "LOAD(w)" -> "LOAD"."""
    return key.split("(", 1)[0].strip()


def check(family: str, defines: dict) -> None:
    """Raise ShaderDefineError unless `defines` fits `family`'s declaration."""
    decl = FAMILIES.get(family)
    if decl is None:
        raise ShaderDefineError(f"no kernel family {family!r}: shaders/families.py declares "
                                f"{', '.join(sorted(FAMILIES))}")
    names = {define_name(k) for k in defines}
    unknown = sorted(names - decl.accepted)
    if unknown:
        raise ShaderDefineError(f"kernel family {family!r} does not take the define(s) "
                                f"{', '.join(unknown)}; it takes {', '.join(sorted(decl.accepted))} "
                                "(shaders/families.py)")
    missing = sorted(decl.required - names)
    if missing:
        raise ShaderDefineError(f"kernel family {family!r} needs the define(s) {', '.join(missing)} "
                                f"(given {', '.join(sorted(names)) or 'none'}; shaders/families.py)")
