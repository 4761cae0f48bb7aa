/* spec_ngram.c - the n-gram (prompt lookup) drafter: for agent contexts that echo tool output
 * or copy code, propose what followed the latest earlier occurrence of the current suffix. */
#include "engine/spec_impl.h"

int spec_ngram_propose(const int32_t *history, int64_t n_history, int n_max, int n_min,
                       int max_drafts, int32_t *drafts_out)
{
    if (history == NULL || max_drafts < 1) {
        return 0;
    }
    for (int k = n_max; k >= n_min; k--) {
        const int32_t *suffix = history + n_history - k;
        if (n_history <= k) {
            continue;
        }
        /* most recent match first; the match must end before the suffix starts */
        for (int64_t j = n_history - k - 1; j >= 0; j--) {
            int same = 1;
            int n = 0;
            for (int i = 0; i < k && same; i++) {
                same = history[j + i] == suffix[i];
            }
            if (!same) {
                continue;
            }
            while (n < max_drafts && j + k + n < n_history) {
                drafts_out[n] = history[j + k + n];
                n++;
            }
            return n;
        }
    }
    return 0;
}
