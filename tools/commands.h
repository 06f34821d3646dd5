/* commands.h — the subcommands of the `ember` tool (tools/ember.c dispatches
 * to them). Each takes its own argv (argv[0] is the subcommand's name) and
 * returns the process exit status: 0 ok, 1 failure, 2 bad usage. */
#ifndef EMBER_TOOLS_COMMANDS_H
#define EMBER_TOOLS_COMMANDS_H

int cmd_env(int argc, char **argv);  /* tools/cmd_env.c */
int cmd_demo(int argc, char **argv);   /* tools/cmd_demo.c */
int cmd_train(int argc, char **argv);  /* tools/cmd_train.c */
int cmd_sample(int argc, char **argv); /* tools/cmd_sample.c */
int cmd_launch(int argc, char **argv); /* tools/cmd_launch.c */
int cmd_config(int argc, char **argv); /* tools/cmd_config.c */
int cmd_test(int argc, char **argv);   /* tools/cmd_test.c */
int cmd_plot(int argc, char **argv);   /* tools/cmd_plot.c */
int cmd_estimate_memory(int argc, char **argv); /* tools/cmd_estimate.c */
int cmd_merge_weights(int argc, char **argv);   /* tools/cmd_merge.c */

#endif
