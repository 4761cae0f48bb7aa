/* placeholder.c - removed once engine modules exist. */
typedef int engine_placeholder_t;
