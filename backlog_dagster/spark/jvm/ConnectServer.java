package backlogdagster.spark;

import org.apache.spark.SparkConf;
import org.apache.spark.sql.classic.SparkSession;

/**
 * A Spark Connect server whose sessions share what Spark compiled and the Python workers
 * it started.
 *
 * <p>Spark's own server ({@code SparkConnectServer}) forces per-session artifact
 * isolation: every session gets class loaders of its own, on the driver and in the
 * executors, and a Python worker factory of its own. Spark's generated code is cached per
 * class loader, so each session (each Dagster run) generates and compiles its query
 * plans' classes again, and the JIT compiles them again, and each starts its own Python
 * daemons, kept until the server stops. A server that serves one project's runs shares
 * them: this starts the same Connect service, as Spark's plugin, with isolation off. What
 * a session adds as an artifact is then seen by the others.
 *
 * <p>Settings come from {@code spark-submit}; the server runs until Spark stops (on
 * SIGTERM, through Spark's shutdown hook).
 */
public final class ConnectServer {
    static final String PLUGIN = "org.apache.spark.sql.connect.SparkConnectPlugin";

    private ConnectServer() {}

    public static void main(String[] args) throws InterruptedException {
        SparkConf conf = new SparkConf();
        String plugins = conf.get("spark.plugins", "");
        conf.set("spark.plugins", plugins.isEmpty() ? PLUGIN : plugins + "," + PLUGIN);
        conf.set("spark.sql.artifact.isolation.enabled", "false");
        SparkSession spark = SparkSession.builder().config(conf).getOrCreate();
        while (!spark.sparkContext().isStopped()) {
            Thread.sleep(1000);
        }
    }
}
