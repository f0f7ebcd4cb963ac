/* Llama 1/2/3 (incl. llama3 rope scaling, handled by the shared rope setup). */
#include "model/model.h"
const sm_family sm_family_llama = { .model_type = "llama" };
