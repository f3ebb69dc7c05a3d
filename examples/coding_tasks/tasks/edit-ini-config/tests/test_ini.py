import configparser

config = configparser.ConfigParser()
assert config.read("app.ini") == ["app.ini"]
server = config["server"]
assert server.getint("port") == 8080 and server.getboolean("debug") is False, dict(server)
assert server["host"] == "0.0.0.0" and server.getint("workers") == 4
assert dict(config["database"]) == {"url": "sqlite:///app.db", "pool_size": "5"}
assert config["cache"].getint("ttl_seconds") == 300
print("ok")
