// kiln_model_server: the model server alone, linked against libkiln_runtime and
// libkiln_serving only (no training code). Same flags as `kiln serve`.
#include "kiln/serving/server.h"

int main(int argc, char** argv) { return kiln::serving::serve_main(argc, argv); }
