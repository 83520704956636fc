"""rdmakit.doca"""
