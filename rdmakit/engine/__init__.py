"""rdmakit.engine"""
