#pragma once
// Shape arithmetic of the 2-d convolution and pooling ops (header-only).
//
// Shared by the ops' shape inference, the kernels of every backend and the
// gradients, so that all of them agree on output sizes and padding. Everything
// here validates and throws InvalidArgumentError naming the op, what was expected
// and what came.
//
// Attributes read (all optional except where noted):
//   strides            [sh, sw], default [1, 1], each >= 1
//   dilations          [dh, dw], default [1, 1], each >= 1 (conv only)
//   padding            "valid" (default), "same" or "explicit" (either case)
//   explicit_paddings  [top, bottom, left, right], each >= 0; with "explicit" only
//   groups             >= 1, default 1 (conv only)
//   data_format        "NHWC" (default) or "NCHW"
//   ksize              [kh, kw], each >= 1 (pooling only, required)
//
// "same" follows TensorFlow: out = ceil(in / stride), pad_total = max((out - 1) *
// stride + (k - 1) * dilation + 1 - in, 0), the odd pixel going to the bottom/right.
// "valid" and explicit padding give out = floor((in + pads - effective_k) / stride) + 1
// and need the padded input to hold at least one effective window.
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/core/attrs.h"
#include "kiln/core/error.h"
#include "kiln/core/shape.h"

namespace kiln::nn_geometry {

enum class PadMode { kValid, kSame, kExplicit };

struct Window2d {
  int64_t kh = 1, kw = 1;   // window (filter) size
  int64_t sh = 1, sw = 1;   // strides
  int64_t dh = 1, dw = 1;   // dilations
  int64_t pt = 0, pb = 0, pl = 0, pr = 0;  // padding top, bottom, left, right
  int64_t oh = 0, ow = 0;   // output size
};

inline std::string ints_str(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

inline std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

inline PadMode parse_padding(const char* op, const std::string& p) {
  std::string l = lower(p);
  if (l == "valid") return PadMode::kValid;
  if (l == "same") return PadMode::kSame;
  if (l == "explicit") return PadMode::kExplicit;
  throw InvalidArgumentError(std::string(op) + ": padding must be \"valid\", \"same\" or explicit {top, bottom, " +
                             "left, right}, got \"" + p + "\"");
}

// Returns true for NCHW, false for NHWC.
inline bool parse_data_format(const char* op, const Attrs& a) {
  std::string f = a.get_string("data_format", "NHWC");
  if (f == "NHWC" || f == "nhwc") return false;
  if (f == "NCHW" || f == "nchw") return true;
  throw InvalidArgumentError(std::string(op) + ": data_format must be \"NHWC\" or \"NCHW\", got \"" + f + "\"");
}

inline std::vector<int64_t> positive_pair(const char* op, const Attrs& a, const char* name, bool required) {
  if (!a.has(name)) {
    if (required) throw InvalidArgumentError(std::string(op) + ": missing attribute '" + name + "'");
    return {1, 1};
  }
  std::vector<int64_t> v = a.get_ints(name);
  if (v.size() != 2 || v[0] < 1 || v[1] < 1)
    throw InvalidArgumentError(std::string(op) + ": " + name + " must be two integers >= 1 (height, width), got " +
                               ints_str(v));
  return v;
}

// One spatial dimension: output size and padding.
inline void window_dim(const char* op, const char* dim, PadMode mode, int64_t in, int64_t k, int64_t s, int64_t d,
                       int64_t explicit_lo, int64_t explicit_hi, int64_t& out, int64_t& lo, int64_t& hi) {
  const int64_t ext = (k - 1) * d + 1;
  if (mode == PadMode::kSame) {
    out = (in + s - 1) / s;
    int64_t total = std::max<int64_t>((out - 1) * s + ext - in, 0);
    lo = total / 2;
    hi = total - lo;
    return;
  }
  lo = mode == PadMode::kExplicit ? explicit_lo : 0;
  hi = mode == PadMode::kExplicit ? explicit_hi : 0;
  if (in + lo + hi < ext)
    throw InvalidArgumentError(std::string(op) + ": the " + dim + " of the padded input (" + std::to_string(in) +
                               " + " + std::to_string(lo + hi) + " padding) is smaller than the effective window (" +
                               std::to_string(ext) + ")");
  out = (in + lo + hi - ext) / s + 1;
}

// Fills strides/dilations/padding/output size of `w` (kh, kw already set) for an
// input of spatial size h x w.
inline void resolve_window(const char* op, const Attrs& a, int64_t h, int64_t wd, bool dilations, Window2d& w) {
  auto st = positive_pair(op, a, "strides", false);
  w.sh = st[0];
  w.sw = st[1];
  if (dilations) {
    auto dl = positive_pair(op, a, "dilations", false);
    w.dh = dl[0];
    w.dw = dl[1];
  }
  PadMode mode = parse_padding(op, a.get_string("padding", "valid"));
  std::vector<int64_t> ep = a.get_ints("explicit_paddings", {});
  if (mode == PadMode::kExplicit) {
    if (ep.size() != 4 || std::any_of(ep.begin(), ep.end(), [](int64_t p) { return p < 0; }))
      throw InvalidArgumentError(std::string(op) + ": explicit padding must be four integers >= 0 {top, bottom, " +
                                 "left, right}, got " + ints_str(ep));
  } else {
    if (!ep.empty())
      throw InvalidArgumentError(std::string(op) + ": explicit_paddings given with padding \"" +
                                 a.get_string("padding", "valid") + "\"");
    ep = {0, 0, 0, 0};
  }
  window_dim(op, "height", mode, h, w.kh, w.sh, w.dh, ep[0], ep[1], w.oh, w.pt, w.pb);
  window_dim(op, "width", mode, wd, w.kw, w.sw, w.dw, ep[2], ep[3], w.ow, w.pl, w.pr);
}

// ---- convolution ---------------------------------------------------------------------

struct Conv2dGeometry {
  bool nchw = false;
  int64_t n = 0, c = 0, h = 0, w = 0;  // input batch, channels, height, width
  int64_t o = 0;                       // output channels
  int64_t groups = 1;
  Window2d win;

  int64_t cin_per_group() const { return c / groups; }
  int64_t cout_per_group() const { return o / groups; }
  Shape input_shape() const { return nchw ? Shape{n, c, h, w} : Shape{n, h, w, c}; }
  // NHWC: HWIO [kh, kw, c/groups, o]; NCHW: OIHW [o, c/groups, kh, kw].
  Shape filter_shape() const {
    return nchw ? Shape{o, c / groups, win.kh, win.kw} : Shape{win.kh, win.kw, c / groups, o};
  }
  Shape output_shape() const { return nchw ? Shape{n, o, win.oh, win.ow} : Shape{n, win.oh, win.ow, o}; }
};

// Geometry of conv2d for input shape `x` and filter shape `f`.
inline Conv2dGeometry conv2d_geometry(const char* op, const Shape& x, const Shape& f, const Attrs& a) {
  Conv2dGeometry g;
  g.nchw = parse_data_format(op, a);
  const char* fmt = g.nchw ? "NCHW" : "NHWC";
  const char* flay = g.nchw ? "OIHW [out_channels, in_channels/groups, kh, kw]" : "HWIO [kh, kw, in_channels/groups, "
                                                                                 "out_channels]";
  if (x.rank() != 4)
    throw InvalidArgumentError(std::string(op) + ": input must have rank 4 (" + fmt + "), got shape " + x.str());
  if (f.rank() != 4)
    throw InvalidArgumentError(std::string(op) + ": filter must have rank 4 (" + flay + "), got shape " + f.str());
  g.n = x[0];
  g.c = g.nchw ? x[1] : x[3];
  g.h = g.nchw ? x[2] : x[1];
  g.w = g.nchw ? x[3] : x[2];
  int64_t fi = g.nchw ? f[1] : f[2];
  g.o = g.nchw ? f[0] : f[3];
  g.win.kh = g.nchw ? f[2] : f[0];
  g.win.kw = g.nchw ? f[3] : f[1];
  g.groups = a.get_int("groups", 1);
  if (g.groups < 1)
    throw InvalidArgumentError(std::string(op) + ": groups must be >= 1, got " + std::to_string(g.groups));
  if (g.c < 1 || g.o < 1 || g.win.kh < 1 || g.win.kw < 1 || fi < 1)
    throw InvalidArgumentError(std::string(op) + ": input channels and every filter dim must be >= 1, got input " +
                               x.str() + " and filter " + f.str() + " (" + flay + ")");
  if (g.c % g.groups != 0)
    throw InvalidArgumentError(std::string(op) + ": input channels (" + std::to_string(g.c) +
                               ") must be divisible by groups (" + std::to_string(g.groups) + ")");
  if (g.o % g.groups != 0)
    throw InvalidArgumentError(std::string(op) + ": output channels (" + std::to_string(g.o) +
                               ") must be divisible by groups (" + std::to_string(g.groups) + ")");
  if (fi != g.c / g.groups)
    throw InvalidArgumentError(std::string(op) + ": channel mismatch: input " + x.str() + " (" + fmt + ") has " +
                               std::to_string(g.c) + " channels, so with groups=" + std::to_string(g.groups) +
                               " the filter (" + flay + ") needs " + std::to_string(g.c / g.groups) +
                               " input channels, got filter " + f.str());
  resolve_window(op, a, g.h, g.w, true, g.win);
  return g;
}

// ---- pooling -------------------------------------------------------------------------

struct Pool2dGeometry {
  bool nchw = false;
  int64_t n = 0, c = 0, h = 0, w = 0;
  Window2d win;
  Shape output_shape() const { return nchw ? Shape{n, c, win.oh, win.ow} : Shape{n, win.oh, win.ow, c}; }
  // A 2x2 window at stride 2, no padding or dilation, NHWC: the pooling the fused
  // kernels (conv + pool, their gradients) handle.
  bool nhwc_2x2_stride_2() const {
    return !nchw && win.kh == 2 && win.kw == 2 && win.sh == 2 && win.sw == 2 && win.dh == 1 && win.dw == 1 &&
           win.pt == 0 && win.pb == 0 && win.pl == 0 && win.pr == 0;
  }
  // Every axis but the channel one: what a per-channel (bias gradient) sum reduces.
  std::vector<int64_t> non_channel_axes() const {
    return nchw ? std::vector<int64_t>{0, 2, 3} : std::vector<int64_t>{0, 1, 2};
  }
};

inline Pool2dGeometry pool2d_geometry(const char* op, const Shape& x, const Attrs& a) {
  Pool2dGeometry g;
  g.nchw = parse_data_format(op, a);
  if (x.rank() != 4)
    throw InvalidArgumentError(std::string(op) + ": input must have rank 4 (" + (g.nchw ? "NCHW" : "NHWC") +
                               "), got shape " + x.str());
  g.n = x[0];
  g.c = g.nchw ? x[1] : x[3];
  g.h = g.nchw ? x[2] : x[1];
  g.w = g.nchw ? x[3] : x[2];
  auto k = positive_pair(op, a, "ksize", true);
  g.win.kh = k[0];
  g.win.kw = k[1];
  resolve_window(op, a, g.h, g.w, false, g.win);
  if (std::max(g.win.pt, g.win.pb) >= g.win.kh || std::max(g.win.pl, g.win.pr) >= g.win.kw)
    throw InvalidArgumentError(std::string(op) + ": padding must be smaller than the window (" +
                               std::to_string(g.win.kh) + "x" + std::to_string(g.win.kw) + "), got {" +
                               std::to_string(g.win.pt) + ", " + std::to_string(g.win.pb) + ", " +
                               std::to_string(g.win.pl) + ", " + std::to_string(g.win.pr) + "}");
  return g;
}

}  // namespace kiln::nn_geometry
