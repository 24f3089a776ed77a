#pragma once
// Everything public of kiln's training API (Keras-style): layers, models, losses,
// metrics, optimizers, schedules, callbacks, checkpoints, TensorBoard, and the data
// readers it uses.
#include "kiln/autodiff/tape.h"
#include "kiln/autodiff/variable.h"
#include "kiln/data/idx.h"
#include "kiln/train/callbacks.h"
#include "kiln/train/checkpoint.h"
#include "kiln/train/export.h"
#include "kiln/train/initializers.h"
#include "kiln/train/layer.h"
#include "kiln/train/layers.h"
#include "kiln/train/losses.h"
#include "kiln/train/mixed_precision.h"
#include "kiln/train/metrics.h"
#include "kiln/train/model.h"
#include "kiln/train/optimizers.h"
#include "kiln/train/schedules.h"
#include "kiln/train/tensorboard.h"
