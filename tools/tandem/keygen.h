/* keygen.h - the `tandem keygen` subcommand (keygen.c). */
#ifndef TANDEM_TOOLS_KEYGEN_H
#define TANDEM_TOOLS_KEYGEN_H

/*
 * tandem_keygen_main - run `tandem keygen` with argv[0] = "keygen" and its flags; prints its
 * usage on --help. Returns the exit status: 0, 1 (a key could not be made or written), 2 (usage).
 */
int tandem_keygen_main(int argc, char **argv);

#endif
