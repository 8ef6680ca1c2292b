"""The SGLang-style language: expressions, the interpreter, choices and chat templates."""
