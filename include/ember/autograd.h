/* ember/autograd.h — the eager tape: requires_grad, backward, gradient hooks,
 * no-grad mode.
 *
 * Every differentiable op, run while grad mode is on and any input requires a
 * gradient, records a node {op, inputs, saved values, output} on the calling
 * thread's tape, in the innermost step scope (recording outside any scope is
 * an EM_ERR_SCOPE error: the tape has to live somewhere). em_backward walks
 * the tape in reverse from the loss. The rule everywhere: gradients of leaves
 * ACCUMULATE (+=), so calling backward once per micro-batch sums them.
 * Gradients of non-leaf tensors are temporaries of the walk and are not kept.
 * The tape and its saved tensors stay until the scope ends, so backward may be
 * called more than once on the same graph.
 */
#ifndef EMBER_AUTOGRAD_H
#define EMBER_AUTOGRAD_H

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What this header declares is the exported API of libember.so, which
 * builds with hidden visibility (meson.build): nothing else leaves it. (nvcc
 * is left out: no .cu file defines a public function.) */
#if defined(__GNUC__) && !defined(__CUDACC__)
#pragma GCC visibility push(default)
#endif

/* Marks a leaf (a tensor no recorded op produced) as wanting a gradient.
 * Float dtypes only. EM_ERR_AUTOGRAD on a non-leaf. */
em_status em_set_requires_grad(em_tensor *t, bool requires_grad);
bool em_requires_grad(const em_tensor *t);
bool em_is_leaf(const em_tensor *t);
/* The accumulated gradient of a leaf: a persistent tensor of t's shape and
 * dtype owned by t (do not em_free it), or NULL if none has been computed yet
 * (no error is set then). A flattened model's parameters always have one (a
 * view of the flat buffer, zeros until backward writes it): em_has_grad
 * says whether it holds a gradient. */
em_tensor *em_grad(const em_tensor *t);
/* Whether leaf t has a gradient in PyTorch's sense (.grad is not None): one
 * was produced for it (by backward, em_set_grad_buffer, or DDP's average)
 * since the last set-to-none zero_grad (em_optim_zero_grad's default mode,
 * ember/optim.h), which clears it. The optimizer skips a parameter without
 * one, and clipping and the loss scaler leave it out. false for a non-leaf,
 * a stale handle (EM_ERR_SCOPE set) or a tensor that never had one. */
bool em_has_grad(const em_tensor *t);
/* Makes the leaf's gradient live in `buffer` (same shape and dtype,
 * contiguous, persistent; typically a view into a flat gradient bucket). The
 * current values of buffer are kept as the gradient (em_has_grad becomes
 * true: PyTorch's p.grad = buffer). t does not own buffer. */
em_status em_set_grad_buffer(em_tensor *t, em_tensor *buffer);
/* Sets the gradient of a leaf to zeros in place (keeps its storage; a
 * tensor with a gradient keeps it, as PyTorch's p.grad.zero_()). */
em_status em_zero_grad(em_tensor *t);

/* Backpropagates from `root`. grad_output NULL means root must have one
 * element and its gradient is 1; otherwise grad_output has root's shape and
 * dtype. Leaves reached accumulate their gradients. Runs with grad mode off,
 * so hooks and backward functions record nothing. */
em_status em_backward(em_tensor *root, em_tensor *grad_output);

/* A new handle sharing t's storage that requires no grad and has no history. */
em_tensor *em_detach(em_tensor *t);

/* Grad mode (per thread, on by default). Returns the previous setting, so a
 * no-grad block is:  bool prev = em_set_grad_enabled(false); ...;
 * em_set_grad_enabled(prev); */
bool em_set_grad_enabled(bool enabled);
bool em_is_grad_enabled(void);

/* Called the moment leaf t's gradient for this backward is final (every use of
 * t reachable from the root has contributed), while the walk continues; DDP
 * starts a bucket's all-reduce from here. `grad` is em_grad(t). Hooks run in
 * registration order; a non-OK status stops backward and is returned by it. */
typedef em_status (*em_grad_hook)(em_tensor *t, em_tensor *grad, void *ctx);
em_status em_register_grad_hook(em_tensor *t, em_grad_hook fn, void *ctx);
em_status em_clear_grad_hooks(em_tensor *t);

/* Nodes on the calling thread's tape (for tests and debugging). */
int64_t em_tape_length(void);

#if defined(__GNUC__) && !defined(__CUDACC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif
#endif
