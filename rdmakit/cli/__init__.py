"""rdmakit.cli"""
