/* ember/ember.h — the whole public API: include this one header. */
#ifndef EMBER_H
#define EMBER_H

#include "amp.h"
#include "autograd.h"
#include "data.h"
#include "dist.h"
#include "nn.h"
#include "optim.h"
#include "profile.h"
#include "runtime.h"
#include "tensor.h"
#include "tracker.h"

#endif
