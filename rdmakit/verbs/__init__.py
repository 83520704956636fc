"""rdmakit.verbs"""
