"""A model file's way into the model store and the authority (`model add
--gguf`, `model pull`), below the CLI: the CLI on the main and the admin API
run these same functions, and what they say (a Transcript) is printed alike
on the main and on a paired controller."""
