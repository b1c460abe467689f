#pragma once
// Unit scaling (seeds 001, 002; SPEC §3): scaled ops f*(x; alpha, beta) compute alpha f(x) in the
// forward pass and beta_i df/dx_i in the backward pass, with the ideal factors of Table A.2 so
// that outputs and gradients are unit-variance for unit-variance inputs. All are built on the
// scaled identity id*(x, alpha, beta). Unit scaling changes the model; SCALIFY (scaled/) changes
// the representation: both compose.
#include <cstdint>
#include <functional>
#include <vector>

#include "scalify/autograd/functions.hpp"

namespace scalify::unit {

// id*(x, alpha, beta): forward alpha x, backward beta g.
Var scaled(const Var& x, double alpha = 1.0, double beta = 1.0);

// While one is alive (on this thread), every id* built uses beta = alpha: the forward pass is
// unchanged and the backward pass gives its exact gradient, so a unit-scaled model's wiring can
// be checked against finite differences. For tests.
class ExactGradients {
 public:
  ExactGradients();
  ~ExactGradients();
  ExactGradients(const ExactGradients&) = delete;
  ExactGradients& operator=(const ExactGradients&) = delete;
  static bool active();

 private:
  bool previous_;
};

// Which inputs of a matmul are non-cut edges (must have alpha = beta, resolved by geometric mean),
// or, as the unit-scaling package's constraints (its default is to_output_scale), which of the
// (alpha, beta_x) pair both take: x_to_output_scale sets beta_x = alpha, x_to_grad_input_scale
// alpha = beta_x. The weight's gradient is a cut edge in all of them.
enum class Constrain : uint8_t { none, x, w, both, x_to_output_scale, x_to_grad_input_scale };

// How an elementwise op's (alpha, beta) become one factor on a non-cut edge (unit-scaling's
// constraints): none keeps both, gmean takes sqrt(alpha beta), to_output_scale alpha,
// to_grad_input_scale beta.
enum class Constraint : uint8_t { none, gmean, to_output_scale, to_grad_input_scale };

// X [..., m] @ W [m, n] over b rows: alpha = m^-1/2, beta_X = n^-1/2, beta_W = b^-1/2, then the
// constraints (Figure A.2): constrained x gives alpha = beta_X = (m n)^-1/4. `product` replaces
// the plain matmul of the unit-scaled operands (a recipe's quantised matmul: its operands and
// output gradient are the unit-scaled ones, so its casts need no scale).
using MatmulFn = std::function<Var(const Var& x, const Var& w)>;
Var matmul(const Var& x, const Var& w, Constrain constrain = Constrain::x, const MatmulFn& product = {});
// X @ W with the given factors: alpha X W forward, beta_x and beta_w on the two gradients.
Var matmul(const Var& x, const Var& w, double alpha, double beta_x, double beta_w, const MatmulFn& product = {});
// Two activations a [..., M, K] @ b [..., K, N] (attention's q k^T and att v): both inputs are
// non-cut edges, so alpha = beta_a = beta_b = (K^-1/2 N^-1/2 M^-1/2)^(1/3).
Var matmul_activations(const Var& a, const Var& b);
// Causal softmax over the last dimension of scores [..., T, T]: row i attends to i + 1 keys, so it
// is multiplied by i + 1 (an output of ~ones, as Table A.2's softmax with s = i + 1); the factor
// is the same forward and backward (alpha = beta), so this is the op's true gradient.
Var causal_softmax(const Var& scores);
// sum over n elements of `dims`: alpha = n^-1/2, beta = 1.
Var sum(const Var& x, const std::vector<int>& dims);
// sum_i gamma_i x_i scaled by alpha = (sum gamma_i^2)^-1/2, beta_i = gamma_i^-1 (unit gradients).
Var weighted_add(const std::vector<Var>& xs, const std::vector<double>& gammas);
// Activations with Table A.2's factors (unconstrained; `constrained` uses alpha = beta = their
// geometric mean, for activations on non-cut edges).
Var relu(const Var& x, bool constrained = false);
Var gelu(const Var& x, bool constrained = false);
Var tanh(const Var& x, bool constrained = false);
Var sigmoid(const Var& x, bool constrained = false);
// The unit-scaling package's (0.3) empirical models with a temperature `mult`, writing
// L(t, lo, hi) = exp(t ln hi + (1 - t) ln lo):
// gelu_erf: gelu(mult x) / mult; alpha = L(t, 2, sqrt(2 / (1 - 1/pi))), beta = L(t, 2, sqrt 2),
//   t = 1 / (1 + 1 / (4 mult^2)).
// silu: x sigmoid(mult x); alpha as gelu_erf's, beta = L(1 / (1 + 1 / mult^2), 2, sqrt 2).
Var gelu_erf(const Var& x, double mult = 1.0, Constraint c = Constraint::to_output_scale);
Var silu(const Var& x, double mult = 1.0, Constraint c = Constraint::to_output_scale);
// softmax over the last dimension of size s, followed by a matmul: alpha = beta = s (output ~ ones).
Var softmax(const Var& x);
// softmax(mult x) over `dim` of size n, the unit-scaling package's model: alpha = L(t, n, sqrt n),
// beta = L(t, n / mult, sqrt(n / mult)), t = 1 / (1 + 4 / mult^2).
Var softmax(const Var& x, int dim, double mult = 1.0, Constraint c = Constraint::to_output_scale);
// softmax cross-entropy over s classes (the loss): alpha = 1, beta = s / sqrt(s - 1).
Var softmax_cross_entropy(const Var& logits, const Tensor& targets);
// u-μP's ops (unit-scaling 0.3.5, functional.py):
// silu_glu: input * silu(gate, mult), the three scales one s = L(1 / (1 + 1 / mult^2), 2, sqrt 2):
//   s on both inputs' gradients and on the output.
Var silu_glu(const Var& input, const Var& gate, double mult = 1.0);
// Causal attention of q, k, v [..., T, d] as scaled_dot_product_attention: softmax(mult q k^T / d) v
// times s, and s on the three inputs' gradients, s = 1 / L(1 / (1 + 4 d / mult^2), sqrt(ln T / T), 1). T = 1 (ln 1 = 0, where unit-scaling
// divides by zero) takes s = 1: the output is v itself. `length` > 0 is the T of s instead of the
// window's (a model's context: its attention keeps its trained scale on shorter windows).
Var scaled_dot_product_attention(const Var& q, const Var& k, const Var& v, double mult = 1.0, int64_t length = 0);
// The same on a packed projection qkv [B, T, 3D] of `heads` heads -> [B, T, D], through the fused
// kernel (scalify::causal_self_attention).
Var causal_self_attention(const Var& qkv, int64_t heads, double mult = 1.0, int64_t length = 0);
// cross_entropy: the mean loss of mult * logits [N, s]; the logits' gradient (softmax - onehot)
// times s / sqrt(s - 1), with neither mult nor 1/N in it.
Var cross_entropy(const Var& logits, const Tensor& targets, double mult = 1.0);
// rms_norm over the last dimension with an optional gain: the gain's gradient times rows^-1/2.
Var rms_norm(const Var& x, const Var& weight, double eps);
// transformer_residual_scaling_rule(residual_mult, residual_attn_ratio)(index, adds): the tau of
// residual add `index` (0-based; even: attention, odd: MLP) of `adds` (2 per layer), Appendix G.
double umup_residual_tau(int index, int adds, double residual_mult, double residual_attn_ratio);

// layer_norm over the last dimension of X [b, n]: alpha = beta_x = 1, beta_w = beta_c = b^-1/2.
Var layer_norm(const Var& x, const Var& weight = {}, const Var& bias = {}, double eps = 1e-5);
// embedding [V, D] gathered by N ids: forward unchanged; beta_W = sqrt(V / N) (each row receives
// about N / V gradients).
Var embedding(const Var& weight, const Tensor& ids);

// Residual connections x_{l+1} = combine(x_l, f(x_l)).
struct Residual {
  // umup: residual_split / residual_add, 1/sqrt(1 + t^2) x + t/sqrt(1 + t^2) f(x), with
  // t = umup_residual_tau(layer - 1, adds, residual_mult, residual_attn_ratio).
  enum class Kind : uint8_t { plain, fixed, running_mean, umup } kind = Kind::fixed;
  double tau = 0.2;                                   // fixed(tau): sqrt(1 - tau) x + sqrt(tau) f(x)
  int adds = 0;                                       // umup: the model's residual adds (2 per layer)
  double residual_mult = 1, residual_attn_ratio = 1;  // umup
  int layer = 1;                                      // running-mean at layer l: sqrt(l / (l + 1)) x + sqrt(1 / (l + 1)) f(x)
  // The residual-branch rewrite id*(f(id*(x, 1, b)), b, 1): the branch runs at unit scale in
  // both directions and its weight b moves onto the gradient at the branch entry.
  bool branch_rewrite = true;
};
Var residual(const Var& x, const std::function<Var(const Var&)>& branch, const Residual& r);

}  // namespace scalify::unit
