/* module_impl.h — what nn/'s files share about modules (nn/module.c):
 * how a layer's forward names itself in an error. */
#ifndef EMBER_NN_MODULE_IMPL_H
#define EMBER_NN_MODULE_IMPL_H

#include "ember/nn.h"

/* The exit of every layer forward: returns y; when y is NULL (the forward
 * failed) it rewrites the thread's error to name the layer first, as
 * "KIND 'full.dotted.name': <the error>" ('(root)' for a root), so the user
 * reads which of their modules failed, not which internal op. A scope error
 * outside any scope becomes what to do about it (call em_scope_begin()
 * before the forward). An error a module inside this one already named is
 * left as it is: the innermost module is named, once. */
em_tensor *nn_named(const em_module *m, const char *kind, em_tensor *y);

#endif
