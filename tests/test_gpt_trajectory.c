/* test_gpt_trajectory.c — the whole training stack against PyTorch: 40
 * steps of a small GPT (model, AdamW with two groups, warm-up + cosine,
 * clipping) must give, step by step, the losses PyTorch got when it replayed
 * the same run from ember's initial weights and batches
 * (tests/fixtures/gen_trajectory.py). A bug anywhere in forward, backward,
 * the optimizer or the schedule shows up as a drift here. */
#include "fixtures/trajectory_ref.h"
#include "harness.h"
#include "traj_impl.h"

TEST(test_gpt_training_follows_pytorch_step_by_step)
{
    double loss[TRAJ_STEPS];
    CHECK_OK(traj_run(NULL, loss));
    for (int s = 0; s < TRAJ_STEPS; s++)
        if (!(fabs(loss[s] - TRAJ_REF_LOSS[s]) < 5e-6 * fabs(TRAJ_REF_LOSS[s])))
            th_fail(__FILE__, __LINE__, "step %d: ember loss %.7f, PyTorch %.7f", s, loss[s],
                    TRAJ_REF_LOSS[s]);
    CHECK(loss[TRAJ_STEPS - 1] < loss[0] - 1.0); /* and it did learn */
    CHECK(em_live_tensors() == 0);
}
