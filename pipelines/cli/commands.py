"""Every command, in the order `sentinel --help` lists them within their group."""

from pipelines.cli import config_commands, lab_commands, model_commands, production

COMMANDS = [*production.COMMANDS, *model_commands.COMMANDS, *lab_commands.COMMANDS, *config_commands.COMMANDS]
