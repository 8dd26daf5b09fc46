/* generate.h — `trident generate` and `trident eval`: a trained model used
 * without the training loop (docs/generate.md). */
#ifndef TRD_CLI_GENERATE_H
#define TRD_CLI_GENERATE_H

/* argv[0] is "generate".  Returns the exit code. */
int generate_main(int argc, char **argv);

/* argv[0] is "eval"; one rank or several (mpiexec / srun). */
int eval_main(int argc, char **argv);

#endif
