/* fuzz_model.h - the router's view of the tiny test model, written to a temporary folder and loaded
 * for the request harnesses (fuzz_request, fuzz_responses).
 *
 * Writes config.json (engine_config_preset "tiny") and the synthetic tokenizer.json of its
 * vocabulary into a fresh temporary folder, loads them with router_model_load (served name
 * "tiny", as fuzz/corpus uses), then removes the folder and all in it. No weights: the router
 * needs none.
 */
#ifndef TANDEM_FUZZ_MODEL_H
#define TANDEM_FUZZ_MODEL_H

#include "router/model.h"

/*
 * fuzz_model_load - the tiny model as the router loads it. Returns the model (caller destroys
 * it with router_model_destroy) or NULL, with the reason on stderr.
 */
router_model_t *fuzz_model_load(void);

#endif
