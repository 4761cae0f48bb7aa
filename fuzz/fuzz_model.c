/* fuzz_model.c - the tiny model for the request harnesses (fuzz_model.h). */
#include "fuzz/fuzz_model.h"

#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/config.h"
#include "text/tokenizer.h"

/* Bytes of a path inside the temporary folder. */
#define FUZZ_MODEL_PATH_BYTES 4096

/* Remove the folder and every file in it (the loader may leave its own, e.g. a digest cache). */
static void remove_dir(const char *dir)
{
    char path[FUZZ_MODEL_PATH_BYTES];
    struct dirent *entry;
    DIR *d = opendir(dir);

    if (d != NULL) {
        while ((entry = readdir(d)) != NULL) {
            if (strcmp(entry->d_name, ".") != 0 && strcmp(entry->d_name, "..") != 0) {
                snprintf(path, sizeof(path), "%s/%s", dir, entry->d_name);
                unlink(path);
            }
        }
        closedir(d);
    }
    rmdir(dir);
}

router_model_t *fuzz_model_load(void)
{
    const char *tmp = getenv("TMPDIR");
    char dir[FUZZ_MODEL_PATH_BYTES], config[FUZZ_MODEL_PATH_BYTES], tok[FUZZ_MODEL_PATH_BYTES];
    char err[512] = "";
    engine_config_t cfg;
    router_model_params_t mp = {0};
    router_model_t *model = NULL;
    json_t *root;

    snprintf(dir, sizeof(dir), "%s/tandem-fuzz-XXXXXX", tmp != NULL ? tmp : "/tmp");
    if (mkdtemp(dir) == NULL) {
        perror("fuzz_model_load: mkdtemp");
        return NULL;
    }
    snprintf(config, sizeof(config), "%s/config.json", dir);
    snprintf(tok, sizeof(tok), "%s/tokenizer.json", dir);
    if (engine_config_preset("tiny", &cfg) != TDM_OK) {
        fprintf(stderr, "fuzz_model_load: no tiny preset\n");
        goto out_remove;
    }
    root = engine_config_to_json(&cfg);
    if (root == NULL || json_dump_file(root, config, JSON_INDENT(2)) != 0) {
        fprintf(stderr, "fuzz_model_load: cannot write %s\n", config);
        json_decref(root);
        goto out_remove;
    }
    json_decref(root);
    if (text_tokenizer_write_synthetic_hf(tok, (uint32_t)cfg.vocab_size, err, sizeof(err)) !=
        TDM_OK) {
        fprintf(stderr, "fuzz_model_load: %s\n", err);
        goto out_remove;
    }
    mp.model_dir = dir;
    mp.served_name = "tiny";
    if (router_model_load(&mp, &model, err, sizeof(err)) != TDM_OK) {
        fprintf(stderr, "fuzz_model_load: %s\n", err);
        model = NULL;
    }
out_remove:
    remove_dir(dir);
    return model;
}
