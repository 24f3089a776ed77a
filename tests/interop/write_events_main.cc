// Writes a known set of scalars with kiln's SummaryWriter into the log directory given
// as argv[1]; read_events.py then checks them with stock TensorBoard.
#include <cstdio>
#include <exception>

#include "kiln/train/tensorboard.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s LOGDIR\n", argv[0]);
    return 2;
  }
  try {
    kiln::train::SummaryWriter w(argv[1]);
    // Keep in sync with EXPECTED in read_events.py.
    for (int step = 0; step < 5; ++step) {
      w.scalar("train/loss", 1.0 / (step + 1), step);
      w.scalar("train/accuracy", 0.5 + 0.1 * step, step);
    }
    w.scalar("val/loss", 0.0, 4);
    w.scalar("val/loss", -3.25, 1000000);
    w.flush();
    std::printf("%s\n", w.path().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "write_events: %s\n", e.what());
    return 1;
  }
  return 0;
}
